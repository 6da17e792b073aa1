/* The dns benchmark's load: COUNT queries for NAME to SERVER:53 from one UDP socket, at most WINDOW in
 * flight, sent and received in batches (sendmmsg/recvmmsg). Prints one JSON line: sent, answered, lost,
 * seconds. A query not answered within a second is given up (lost: sent and not answered).
 *
 *   dns_storm_client SERVER NAME COUNT WINDOW
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	struct sockaddr_in server = {.sin_family = AF_INET, .sin_port = htons(53)};
	static unsigned char queries[BATCH][300], answers[BATCH][600];
	struct mmsghdr out[BATCH], in[BATCH];
	struct iovec out_vec[BATCH], in_vec[BATCH];
	struct timeval second = {.tv_sec = 1};
	unsigned long count, window, sent = 0, answered = 0, lost = 0;
	unsigned int qlen = 12;
	unsigned short id = 0;
	double started;
	int fd;

	if (argc != 5) {
		fprintf(stderr, "usage: %s SERVER NAME COUNT WINDOW\n", argv[0]);
		return 2;
	}
	count = strtoul(argv[3], NULL, 10);
	window = strtoul(argv[4], NULL, 10);
	inet_pton(AF_INET, argv[1], &server.sin_addr);
	/* The query: header (RD), the name as labels, type A, class IN. */
	memset(queries[0], 0, sizeof(queries[0]));
	queries[0][2] = 0x01, queries[0][5] = 1;
	for (char *label = strtok(argv[2], "."); label; label = strtok(NULL, ".")) {
		size_t length = strlen(label);

		queries[0][qlen++] = length;
		memcpy(queries[0] + qlen, label, length);
		qlen += length;
	}
	memcpy(queries[0] + qlen, "\x00\x00\x01\x00\x01", 5);
	qlen += 5;
	for (int i = 1; i < BATCH; i++)
		memcpy(queries[i], queries[0], qlen);
	fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&server, sizeof(server))) {
		perror("connect");
		return 1;
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &second, sizeof(second));
	for (int i = 0; i < BATCH; i++) {
		out_vec[i] = (struct iovec){.iov_base = queries[i], .iov_len = qlen};
		out[i].msg_hdr = (struct msghdr){.msg_iov = &out_vec[i], .msg_iovlen = 1};
		in_vec[i] = (struct iovec){.iov_base = answers[i], .iov_len = sizeof(answers[i])};
		in[i].msg_hdr = (struct msghdr){.msg_iov = &in_vec[i], .msg_iovlen = 1};
	}
	started = now();
	while (answered < sent || sent < count) {
		unsigned long room = window - (sent - answered), batch = count - sent;
		int got;

		if (batch > room)
			batch = room;
		if (batch > BATCH)
			batch = BATCH;
		if (batch) {
			for (unsigned long i = 0; i < batch; i++) {
				id++;
				queries[i][0] = id >> 8, queries[i][1] = id & 0xff;
			}
			got = sendmmsg(fd, out, batch, 0);
			if (got > 0)
				sent += got;
		}
		got = recvmmsg(fd, in, BATCH, MSG_WAITFORONE, NULL);
		if (got > 0) {
			answered += got;
		} else if (errno == EAGAIN || errno == EWOULDBLOCK) {
			/* Nothing for a second: what is in flight is lost; go on with a full window. */
			lost += sent - answered;
			count -= sent - answered;
			sent = answered;
		}
	}
	printf("{\"sent\": %lu, \"answered\": %lu, \"lost\": %lu, \"seconds\": %.6f}\n", sent + lost, answered,
	       lost, now() - started);
	return 0;
}
