/*
 * nm_forward PORT_A PORT_B SECONDS [poll|select|epoll]: a two-port forwarder in the style of
 * netmap's bridge, with the legacy API (nm_open): it sleeps on both descriptors (in poll() by
 * default, or select() or epoll_wait()) and copies every frame received on one port to the
 * other, until SECONDS pass or SIGTERM.  Prints "forwarded A_TO_B B_TO_A cpu_ms C" (its own
 * CPU time).
 */
#define NETMAP_WITH_LIBS
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/resource.h>
#include <net/netmap_user.h>

#include "nm_common.h"

static volatile sig_atomic_t stop;

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

/* Moves what fits from the rx rings of `from` into the tx rings of `to`. */
static unsigned long move(struct nm_desc *from, struct nm_desc *to)
{
	unsigned long n = 0;
	unsigned ti = to->first_tx_ring;

	for (unsigned ri = from->first_rx_ring; ri <= from->last_rx_ring; ri++) {
		struct netmap_ring *rx = NETMAP_RXRING(from->nifp, ri);
		while (!nm_ring_empty(rx)) {
			struct netmap_ring *tx = NETMAP_TXRING(to->nifp, ti);
			while (nm_ring_empty(tx) && ti < to->last_tx_ring)
				tx = NETMAP_TXRING(to->nifp, ++ti);
			if (nm_ring_empty(tx))
				return n; /* every tx ring full: wait for room */
			struct netmap_slot *rs = &rx->slot[rx->head], *ts = &tx->slot[tx->head];
			nm_pkt_copy(NETMAP_BUF(rx, rs->buf_idx), NETMAP_BUF(tx, ts->buf_idx), rs->len);
			ts->len = rs->len;
			ts->flags = 0;
			tx->head = tx->cur = nm_ring_next(tx, tx->head);
			rx->head = rx->cur = nm_ring_next(rx, rx->head);
			n++;
		}
	}
	return n;
}

static int pending_rx(struct nm_desc *d)
{
	for (unsigned ri = d->first_rx_ring; ri <= d->last_rx_ring; ri++)
		if (!nm_ring_empty(NETMAP_RXRING(d->nifp, ri)))
			return 1;
	return 0;
}

/* Waits as poll() would on p[0..1], with the call `how` names. */
static int wait_on(const char *how, int ep, struct pollfd *p, int ms)
{
	if (strcmp(how, "select") == 0) {
		fd_set rd, wr;
		struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
		int n = (p[0].fd > p[1].fd ? p[0].fd : p[1].fd) + 1, r;
		FD_ZERO(&rd);
		FD_ZERO(&wr);
		for (int i = 0; i < 2; i++) {
			if (p[i].events & POLLIN)
				FD_SET(p[i].fd, &rd);
			if (p[i].events & POLLOUT)
				FD_SET(p[i].fd, &wr);
		}
		r = select(n, &rd, &wr, NULL, &tv);
		for (int i = 0; r >= 0 && i < 2; i++)
			p[i].revents = (short)((FD_ISSET(p[i].fd, &rd) ? POLLIN : 0) |
					       (FD_ISSET(p[i].fd, &wr) ? POLLOUT : 0));
		return r;
	}
	if (strcmp(how, "epoll") == 0) {
		struct epoll_event ev[2];
		int r;
		for (int i = 0; i < 2; i++) {
			struct epoll_event e = {.events = (uint32_t)p[i].events, .data.u32 = (uint32_t)i};
			p[i].revents = 0;
			if (epoll_ctl(ep, EPOLL_CTL_MOD, p[i].fd, &e) < 0)
				return -1;
		}
		r = epoll_wait(ep, ev, 2, ms);
		for (int k = 0; k < r; k++)
			p[ev[k].data.u32].revents = (short)ev[k].events;
		return r;
	}
	return poll(p, 2, ms);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: nm_forward PORT_A PORT_B SECONDS [poll|select|epoll]\n");
		return 2;
	}
	struct nm_desc *a = nm_open(argv[1], NULL, 0, NULL);
	struct nm_desc *b = a ? nm_open(argv[2], NULL, 0, NULL) : NULL;
	if (a == NULL || b == NULL) {
		fprintf(stderr, "nm_forward: nm_open failed: %s\n", strerror(errno));
		return 1;
	}
	const char *how = argc > 4 ? argv[4] : "poll";
	int ep = epoll_create1(0);
	for (int i = 0; i < 2; i++) {
		struct epoll_event e = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
		if (epoll_ctl(ep, EPOLL_CTL_ADD, i ? b->fd : a->fd, &e) < 0) {
			fprintf(stderr, "nm_forward: epoll_ctl: %s\n", strerror(errno));
			return 1;
		}
	}
	signal(SIGTERM, on_term);
	double end = now_s() + atof(argv[3]);
	unsigned long ab = 0, ba = 0;

	printf("ready\n");
	fflush(stdout);
	while (!stop && now_s() < end) {
		struct pollfd p[2] = {{.fd = a->fd, .events = POLLIN}, {.fd = b->fd, .events = POLLIN}};
		/* Frames waiting for room on the other side: wait for room there instead. */
		if (pending_rx(a)) {
			p[1].events |= POLLOUT;
			p[0].events = 0;
		}
		if (pending_rx(b)) {
			p[0].events |= POLLOUT;
			p[1].events = 0;
		}
		int r = wait_on(how, ep, p, 200);
		if (r < 0 && errno != EINTR) {
			fprintf(stderr, "nm_forward: %s: %s\n", how, strerror(errno));
			return 1;
		}
		if ((p[0].revents | p[1].revents) & (POLLERR | POLLHUP)) {
			fprintf(stderr, "nm_forward: a port is gone\n");
			return 1;
		}
		ab += move(a, b);
		ba += move(b, a);
	}
	/* Push out what is queued. */
	ioctl(a->fd, NIOCTXSYNC, NULL);
	ioctl(b->fd, NIOCTXSYNC, NULL);
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	long cpu_ms = (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
		      (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
	printf("forwarded %lu %lu cpu_ms %ld\n", ab, ba, cpu_ms);
	nm_close(b);
	nm_close(a);
	return 0;
}
