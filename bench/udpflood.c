// Sends N UDP datagrams as fast as one core can, and reports how many were accepted and how many the kernel
// refused with EPERM (a netfilter OUTPUT drop: exactly one skb dropped per refusal). Used by the drop-storm
// test and benchmark, where a Python sender would be the bottleneck instead of the kernel.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: %s ADDR PORT COUNT [PAYLOAD_BYTES [PER_SECOND]]\n", argv[0]);
		return 2;
	}
	struct sockaddr_storage dst = {0};
	socklen_t dst_len;
	int family = strchr(argv[1], ':') ? AF_INET6 : AF_INET;
	if (family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&dst;
		in->sin_family = AF_INET;
		in->sin_port = htons(atoi(argv[2]));
		if (inet_pton(AF_INET, argv[1], &in->sin_addr) != 1)
			return 2;
		dst_len = sizeof(*in);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&dst;
		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons(atoi(argv[2]));
		if (inet_pton(AF_INET6, argv[1], &in6->sin6_addr) != 1)
			return 2;
		dst_len = sizeof(*in6);
	}
	long count = atol(argv[3]);
	size_t payload_len = argc > 4 ? (size_t)atol(argv[4]) : 16;
	/* Optional pace (datagrams per second, 0: as fast as possible): the sampling-threshold benchmark
	 * needs storms of a known rate. Checked every 64 sends, so the pace costs nothing measurable. */
	double per_second = argc > 5 ? atof(argv[5]) : 0;
	char payload[1500] = {0};
	if (payload_len > sizeof(payload))
		payload_len = sizeof(payload);
	int fd = socket(family, SOCK_DGRAM, 0);
	if (fd < 0) {
		perror("socket");
		return 1;
	}
	long sent = 0, refused = 0, other = 0;
	struct timespec start, end;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (long i = 0; i < count; i++) {
		if (per_second > 0 && (i & 63) == 0) {
			struct timespec now;
			clock_gettime(CLOCK_MONOTONIC, &now);
			double ahead = i / per_second - ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9);
			if (ahead > 0) {
				struct timespec pause = {(time_t)ahead, (long)((ahead - (time_t)ahead) * 1e9)};
				nanosleep(&pause, NULL);
			}
		}
		if (sendto(fd, payload, payload_len, 0, (struct sockaddr *)&dst, dst_len) >= 0)
			sent++;
		else if (errno == EPERM)
			refused++;
		else
			other++;
	}
	clock_gettime(CLOCK_MONOTONIC, &end);
	double seconds = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
	/* The pid tells this storm's drops from others' on a shared machine (a tracer reports whose drop it was). */
	printf("{\"sent\": %ld, \"refused\": %ld, \"other_errors\": %ld, \"seconds\": %.6f, \"pid\": %d}\n", sent,
	       refused, other, seconds, (int)getpid());
	return 0;
}
