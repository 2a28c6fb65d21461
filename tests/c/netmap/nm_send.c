/*
 * nm_send PORT COUNT LEN [BURST [FORK]]: sends COUNT test frames of LEN bytes with libnetmap
 * (nmport_open) and the sync ioctls, frame k on tx ring k % rings, waiting in poll() for
 * room when the rings are full, BURST frames (default 64) between syncs.  Prints
 * "sent N" and exits 0.  A netmap program: netmap's standard API only.
 *
 * FORK, once the port is open: "close" forks a helper that closes descriptors 3..1023 and
 * exits, "close_range" one that does it with close_range(), "exec" one that execs
 * /bin/true, "exit" one that exits; the sender waits for it, then sends.  "handover" forks
 * a child that sends instead, once the parent has closed its own descriptor (nmport_close).
 *
 * NM_SEND_PAUSE_US in the environment: the pause after each burst (default 20 us).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <libnetmap.h>

#include "nm_common.h"

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: nm_send PORT COUNT LEN [BURST]\n");
		return 2;
	}
	struct nmport_d *d = nmport_open(argv[1]);
	if (d == NULL) {
		fprintf(stderr, "nm_send: nmport_open %s failed: %s\n", argv[1], strerror(errno));
		return 1;
	}
	unsigned long count = strtoul(argv[2], NULL, 0);
	unsigned len = (unsigned)strtoul(argv[3], NULL, 0);
	unsigned burst = argc > 4 ? (unsigned)strtoul(argv[4], NULL, 0) : 64;
	const char *fork_how = argc > 5 ? argv[5] : NULL;

	if (fork_how) {
		fflush(stdout);
		pid_t pid = fork();
		if (pid < 0) {
			fprintf(stderr, "nm_send: fork: %s\n", strerror(errno));
			return 1;
		}
		int handover = strcmp(fork_how, "handover") == 0;
		if (pid == 0 && !handover) {
			if (strcmp(fork_how, "close") == 0) {
				for (int fd = 3; fd < 1024; fd++)
					close(fd);
			} else if (strcmp(fork_how, "close_range") == 0) {
				close_range(3, ~0U, 0);
			} else if (strcmp(fork_how, "exec") == 0) {
				execl("/bin/true", "true", (char *)NULL);
			}
			_exit(0);
		}
		if (pid > 0 && handover) {
			/* The child sends: the parent closes its descriptor, then waits. */
			nmport_close(d);
			int st;
			waitpid(pid, &st, 0);
			return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
		}
		if (pid > 0) {
			int st;
			waitpid(pid, &st, 0);
		} else {
			usleep(200000); /* the parent's close comes first */
		}
	}
	unsigned rings = d->last_tx_ring - d->first_tx_ring + 1;
	unsigned long sent = 0;
	double deadline = now_s() + 30;
	const char *pause_env = getenv("NM_SEND_PAUSE_US");
	useconds_t pause_us = pause_env ? (useconds_t)strtoul(pause_env, NULL, 0) : 20;

	while (sent < count && now_s() < deadline) {
		unsigned queued = 0;
		while (queued < burst && sent < count) {
			unsigned r = d->first_tx_ring + (unsigned)(sent % rings);
			struct netmap_ring *ring = NETMAP_TXRING(d->nifp, r);
			if (nm_ring_empty(ring))
				break; /* ring full: sync and wait below */
			struct netmap_slot *slot = &ring->slot[ring->cur];
			fill_frame((unsigned char *)NETMAP_BUF(ring, slot->buf_idx), (uint32_t)sent, r, len);
			slot->len = (uint16_t)len;
			ring->head = ring->cur = nm_ring_next(ring, ring->cur);
			sent++;
			queued++;
		}
		if (ioctl(d->fd, NIOCTXSYNC, NULL) < 0) {
			fprintf(stderr, "nm_send: NIOCTXSYNC: %s\n", strerror(errno));
			return 1;
		}
		if (queued < burst && sent < count) {
			struct pollfd p = {.fd = d->fd, .events = POLLOUT};
			if (poll(&p, 1, 1000) < 0 && errno != EINTR) {
				fprintf(stderr, "nm_send: poll: %s\n", strerror(errno));
				return 1;
			}
		} else {
			usleep(pause_us); /* pace: a receiver that sleeps in poll keeps up */
		}
	}
	/* Let valed take the last slots before the port goes away. */
	for (int i = 0; i < 100; i++) {
		int pending = 0;
		ioctl(d->fd, NIOCTXSYNC, NULL);
		for (unsigned r = d->first_tx_ring; r <= d->last_tx_ring; r++)
			pending |= nm_tx_pending(NETMAP_TXRING(d->nifp, r));
		if (!pending)
			break;
		usleep(1000);
	}
	printf("sent %lu\n", sent);
	nmport_close(d);
	return sent == count ? 0 : 1;
}
