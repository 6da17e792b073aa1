/* A minimal authoritative DNS responder for the dns benchmark: every query for any name gets one A record
 * (198.18.0.9), NOERROR. It answers in batches (recvmmsg/sendmmsg) so the server is not what limits a query
 * storm on a small machine; the answers are real DNS messages that resolvers and dnspython accept.
 *
 *   dns_responder ADDRESS PORT
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define BATCH 64
#define SIZE 512

int main(int argc, char **argv)
{
	struct sockaddr_in addr = {.sin_family = AF_INET};
	static unsigned char buffers[BATCH][SIZE + 16];
	struct sockaddr_in peers[BATCH];
	struct mmsghdr messages[BATCH];
	struct iovec vectors[BATCH];
	int fd;

	if (argc != 3) {
		fprintf(stderr, "usage: %s ADDRESS PORT\n", argv[0]);
		return 2;
	}
	fd = socket(AF_INET, SOCK_DGRAM, 0);
	addr.sin_port = htons(atoi(argv[2]));
	inet_pton(AF_INET, argv[1], &addr.sin_addr);
	if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof(addr))) {
		perror("bind");
		return 1;
	}
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		int got;

		for (int i = 0; i < BATCH; i++) {
			vectors[i] = (struct iovec){.iov_base = buffers[i], .iov_len = SIZE};
			messages[i].msg_hdr = (struct msghdr){.msg_name = &peers[i],
							      .msg_namelen = sizeof(peers[i]),
							      .msg_iov = &vectors[i],
							      .msg_iovlen = 1};
		}
		got = recvmmsg(fd, messages, BATCH, MSG_WAITFORONE, NULL);
		if (got <= 0)
			continue;
		for (int i = 0; i < got; i++) {
			unsigned char *m = buffers[i];
			unsigned int len = messages[i].msg_len, at = 12;

			if (len < 17)
				continue;
			while (at < len && m[at] && at < SIZE - 40)
				at += m[at] + 1;
			at += 5; /* the zero label, qtype, qclass: anything after (EDNS) is dropped */
			m[2] = 0x84 | (m[2] & 0x01); /* QR, AA, RD as asked */
			m[3] = 0x00;		     /* NOERROR */
			m[6] = 0, m[7] = 1;	     /* one answer */
			m[8] = m[9] = m[10] = m[11] = 0;
			memcpy(m + at, "\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04\xc6\x12\x00\x09", 16);
			vectors[i].iov_len = at + 16;
			messages[i].msg_hdr.msg_namelen = sizeof(peers[i]);
		}
		sendmmsg(fd, messages, got, 0);
	}
}
