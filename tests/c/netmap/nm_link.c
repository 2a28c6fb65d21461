/*
 * nm_link PORT LEN IDLE_MS [poll|epoll]: a link emulator's way with one port: PORT is
 * opened twice (nmport_open on two descriptors, as netmap allows), one thread receives on
 * the first descriptor, another transmits on the second, each waiting on its own
 * descriptor in poll() (or in epoll_wait() on an epoll instance of its own, with "epoll").
 * Every frame received (checked byte by byte) is queued and sent back out of the port by
 * the other thread.  Stops IDLE_MS after the last frame (5 s before the first) once the
 * queue is empty, or after 60 s.  Prints "received R forwarded F bad B tx_timeouts T
 * rx_lost L" (T: waits for room on the tx ring that lasted their whole second; L: waits for
 * frames, once they flowed, that lasted their whole second with frames in the ring: both
 * are wake-ups lost) and exits 0 if every frame received was forwarded, none was bad and
 * no wake-up was lost. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <libnetmap.h>

#include "nm_common.h"

#define QLEN 4096 /* frames in flight between the threads (a power of two) */
#define QBUF 2048

static unsigned char queue[QLEN][QBUF];
static uint16_t qlen[QLEN];
static _Atomic unsigned long q_in, q_out; /* frames queued, frames sent */
static _Atomic int rx_done;
static unsigned want_len;
static int idle_ms;
static int rx_poll_ms = 1000;
static int use_epoll;

/* poll() on one descriptor, or the same wait through an epoll instance of the thread's. */
static int wait_one(int *ep, struct pollfd *p, int ms)
{
	if (!use_epoll)
		return poll(p, 1, ms);
	struct epoll_event e = {.events = (uint32_t)p->events};
	if (*ep < 0) {
		*ep = epoll_create1(0);
		if (*ep < 0 || epoll_ctl(*ep, EPOLL_CTL_ADD, p->fd, &e) < 0)
			return -1;
	}
	int r = epoll_wait(*ep, &e, 1, ms);
	p->revents = r > 0 ? (short)e.events : 0;
	return r;
}
static unsigned long bad, rx_lost;

static void *receiver(void *arg)
{
	struct nmport_d *d = arg;
	double last = now_s(), start = last;
	int ep = -1;
	unsigned long got = 0;

	for (;;) {
		struct pollfd p = {.fd = d->fd, .events = POLLIN};
		if (q_in - q_out >= QLEN) {
			usleep(100); /* the queue is full: leave the frames in the ring */
			continue;
		}
		int r = wait_one(&ep, &p, rx_poll_ms);
		if (r < 0 && errno != EINTR) {
			fprintf(stderr, "nm_link: poll (rx): %s\n", strerror(errno));
			bad++;
			break;
		}
		if (p.revents & (POLLERR | POLLHUP)) {
			fprintf(stderr, "nm_link: the receiving descriptor's port is gone\n");
			bad++;
			break;
		}
		unsigned long n = 0;
		for (unsigned ri = d->first_rx_ring; ri <= d->last_rx_ring; ri++) {
			struct netmap_ring *ring = NETMAP_RXRING(d->nifp, ri);
			while (!nm_ring_empty(ring) && q_in - q_out < QLEN) {
				struct netmap_slot *s = &ring->slot[ring->head];
				unsigned char *f = (unsigned char *)NETMAP_BUF(ring, s->buf_idx);
				uint32_t seq, tag;
				if (check_frame(f, s->len, want_len, &seq, &tag) < 0 && bad++ < 5)
					fprintf(stderr, "nm_link: bad frame (len %u)\n", s->len);
				unsigned long k = q_in % QLEN;
				memcpy(queue[k], f, s->len);
				qlen[k] = s->len;
				q_in++;
				ring->head = ring->cur = nm_ring_next(ring, ring->head);
				n++;
			}
		}
		if (r == 0 && n > 0 && got > 0)
			rx_lost++; /* frames were there, mid-stream, and the wait lasted its second */
		if (n) {
			got += n;
			last = now_s();
		} else if (now_s() - last > (got ? idle_ms / 1e3 : 5.0) || now_s() - start > 60) {
			break;
		}
	}
	rx_done = 1;
	return NULL;
}

static unsigned long tx_timeouts;

static void *transmitter(void *arg)
{
	struct nmport_d *d = arg;
	double end = now_s() + 70;
	int ep = -1;

	while (now_s() < end && !(rx_done && q_out == q_in)) {
		if (q_out == q_in) {
			usleep(50); /* nothing to send yet */
			continue;
		}
		/* As netmap transmitters do: wait for room, then fill what there is. */
		struct pollfd p = {.fd = d->fd, .events = POLLOUT};
		int r = wait_one(&ep, &p, 1000);
		if (r < 0 && errno != EINTR) {
			fprintf(stderr, "nm_link: poll (tx): %s\n", strerror(errno));
			bad++;
			break;
		}
		if (r == 0)
			tx_timeouts++; /* a second without room: valed never said the ring had some */
		if (p.revents & (POLLERR | POLLHUP)) {
			fprintf(stderr, "nm_link: the transmitting descriptor's port is gone\n");
			bad++;
			break;
		}
		struct netmap_ring *ring = NETMAP_TXRING(d->nifp, d->first_tx_ring);
		unsigned long moved = 0;
		while (q_out + moved < q_in && !nm_ring_empty(ring)) {
			unsigned long k = (q_out + moved) % QLEN;
			struct netmap_slot *s = &ring->slot[ring->head];
			memcpy(NETMAP_BUF(ring, s->buf_idx), queue[k], qlen[k]);
			s->len = qlen[k];
			s->flags = 0;
			ring->head = ring->cur = nm_ring_next(ring, ring->head);
			moved++;
		}
		q_out += moved;
		if (moved)
			ioctl(d->fd, NIOCTXSYNC, NULL);
	}
	/* Let valed take the last slots. */
	for (int i = 0; i < 1000 && nm_tx_pending(NETMAP_TXRING(d->nifp, d->first_tx_ring)); i++) {
		ioctl(d->fd, NIOCTXSYNC, NULL);
		usleep(1000);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: nm_link PORT LEN IDLE_MS\n");
		return 2;
	}
	want_len = (unsigned)strtoul(argv[2], NULL, 0);
	idle_ms = atoi(argv[3]);
	if (argc > 4 && strcmp(argv[4], "epoll") == 0)
		use_epoll = 1;
	struct nmport_d *rx = nmport_open(argv[1]);
	struct nmport_d *tx = rx ? nmport_open(argv[1]) : NULL;
	if (rx == NULL || tx == NULL) {
		fprintf(stderr, "nm_link: cannot open %s twice: %s\n", argv[1], strerror(errno));
		return 1;
	}
	if (want_len > QBUF)
		return 2;
	printf("ready\n");
	fflush(stdout);
	pthread_t tr, tt;
	pthread_create(&tr, NULL, receiver, rx);
	pthread_create(&tt, NULL, transmitter, tx);
	pthread_join(tr, NULL);
	pthread_join(tt, NULL);
	printf("received %lu forwarded %lu bad %lu tx_timeouts %lu rx_lost %lu\n", q_in, q_out, bad, tx_timeouts,
	       rx_lost);
	nmport_close(tx);
	nmport_close(rx);
	return bad == 0 && q_in == q_out && tx_timeouts == 0 && rx_lost == 0 ? 0 : 1;
}
