/*
 * nm_pktgen tx|rx PORT LEN SECONDS: the same sender and receiver written twice over, with the
 * only difference the API that opens, syncs and waits:
 *   built plain: netmap's API (nmport_open, ioctl NIOCTXSYNC/NIOCRXSYNC, poll() on the
 *                descriptor), run preloaded with libvale-netmap.so or linked with it;
 *   built with -DVALE_NATIVE: libvale's own (vale_open, vale_txsync/vale_rxsync, vale_poll).
 * The ring loops are the same code.  tx fills every free slot with a LEN-byte frame (the
 * buffers are written once at the start), syncs, and waits for room when the ring is full,
 * for SECONDS; it prints "tx FRAMES SECONDS".  rx drains its ring after each wait until no
 * frame came for 300 ms after the first (or none in SECONDS + 10), and prints "rx FRAMES".
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef VALE_NATIVE
#include <vale.h>
#else
#include <sys/ioctl.h>
#include <libnetmap.h>
#endif

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The port behind one API: its interface, and sync/wait on ring 0. */
#ifdef VALE_NATIVE
static struct vale_port *port;
static struct netmap_if *open_port(const char *name)
{
	port = vale_open(name, NULL);
	if (port == NULL) {
		fprintf(stderr, "vale_open %s: %s\n", name, vale_last_error());
		exit(1);
	}
	return vale_nifp(port);
}
static void txsync(void) { vale_txsync(port, 0); }
static void rxsync(void) { vale_rxsync(port, 0); }
static int wait_for(int out, int ms) { return vale_poll(port, out ? VALE_POLLOUT : VALE_POLLIN, ms); }
#else
static struct nmport_d *port;
static struct netmap_if *open_port(const char *name)
{
	port = nmport_open(name);
	if (port == NULL) {
		fprintf(stderr, "nmport_open %s: %s\n", name, strerror(errno));
		exit(1);
	}
	return port->nifp;
}
static void txsync(void) { ioctl(port->fd, NIOCTXSYNC, NULL); }
static void rxsync(void) { ioctl(port->fd, NIOCRXSYNC, NULL); }
static int wait_for(int out, int ms)
{
	struct pollfd p = {.fd = port->fd, .events = out ? POLLOUT : POLLIN};
	return poll(&p, 1, ms);
}
#endif

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: nm_pktgen tx|rx PORT LEN SECONDS\n");
		return 2;
	}
	int tx = strcmp(argv[1], "tx") == 0;
	unsigned len = (unsigned)atoi(argv[3]);
	double seconds = atof(argv[4]);
	struct netmap_if *nifp = open_port(argv[2]);
	unsigned long frames = 0;

	if (tx) {
		struct netmap_ring *ring = NETMAP_TXRING(nifp, 0);
		unsigned char frame[2048] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0, 0, 0, 0, 1, 0x88, 0xb5};
		for (unsigned i = 0; i < ring->num_slots; i++)
			memcpy(NETMAP_BUF(ring, ring->slot[i].buf_idx), frame, len);
		double start = now_s(), end = start + seconds, t = start;
		while (t < end) {
			uint32_t head = ring->head, space = nm_ring_space(ring);
			for (uint32_t k = 0; k < space; k++) {
				ring->slot[head].len = (uint16_t)len;
				head = nm_ring_next(ring, head);
			}
			ring->head = ring->cur = head;
			frames += space;
			txsync();
			if (nm_ring_space(ring) == 0)
				wait_for(1, 100);
			t = now_s();
		}
		printf("tx %lu %.6f\n", frames, t - start);
	} else {
		struct netmap_ring *ring = NETMAP_RXRING(nifp, 0);
		double last = 0, start = now_s();
		for (;;) {
			wait_for(0, 100);
			uint32_t n = nm_ring_space(ring);
			if (n) {
				frames += n;
				ring->head = ring->cur = (ring->head + n) % ring->num_slots;
				rxsync();
				last = now_s();
			} else if (last ? now_s() - last > 0.3 : now_s() - start > seconds + 10) {
				break;
			}
		}
		printf("rx %lu\n", frames);
	}
	fflush(stdout);
	return 0;
}
