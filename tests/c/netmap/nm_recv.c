/*
 * nm_recv PORT COUNT LEN THREADS IDLE_MS: receives test frames with libnetmap.  With
 * THREADS = 1 it opens PORT and waits in poll() on its descriptor; with THREADS = T > 1 it
 * opens PORT@conf:rings=T first, then each thread opens PORT-i (ring i only) and waits in
 * poll() on its own descriptor, as netmap programs do.  Every frame is checked byte by byte
 * and, per ring, its sequence number must grow.  Stops after COUNT frames, or IDLE_MS
 * without a frame once one came (5 s before the first).  Prints "received N bad B rings
 * R0,R1,..." and exits 0 if nothing was bad.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <libnetmap.h>

#include "nm_common.h"

#define MAX_THREADS 16

static unsigned long want_count;
static unsigned want_len;
static int idle_ms;
static unsigned long total; /* under lock */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

struct worker {
	struct nmport_d *d;
	unsigned long received, bad;
	pthread_t tid;
};

static int done(void)
{
	pthread_mutex_lock(&lock);
	int d = total >= want_count;
	pthread_mutex_unlock(&lock);
	return d;
}

static void *run(void *arg)
{
	struct worker *w = arg;
	struct nmport_d *d = w->d;
	long last_seq[64];
	double last = now_s(), start = last;

	for (int i = 0; i < 64; i++)
		last_seq[i] = -1;
	while (!done()) {
		struct pollfd p = {.fd = d->fd, .events = POLLIN};
		int r = poll(&p, 1, 100);
		if (r < 0 && errno != EINTR) {
			fprintf(stderr, "nm_recv: poll: %s\n", strerror(errno));
			w->bad++;
			break;
		}
		if (p.revents & (POLLERR | POLLHUP)) {
			fprintf(stderr, "nm_recv: poll says the port is gone\n");
			w->bad++;
			break;
		}
		unsigned long got = 0;
		for (unsigned ri = d->first_rx_ring; ri <= d->last_rx_ring; ri++) {
			struct netmap_ring *ring = NETMAP_RXRING(d->nifp, ri);
			while (!nm_ring_empty(ring)) {
				struct netmap_slot *s = &ring->slot[ring->head];
				uint32_t seq, tag;
				if (check_frame((unsigned char *)NETMAP_BUF(ring, s->buf_idx), s->len, want_len, &seq,
						&tag) < 0 ||
				    tag >= 64 || (long)seq <= last_seq[tag]) {
					if (w->bad++ < 5)
						fprintf(stderr, "nm_recv: bad frame on ring %u (len %u)\n", ri, s->len);
				} else {
					last_seq[tag] = seq;
				}
				ring->head = ring->cur = nm_ring_next(ring, ring->head);
				got++;
			}
		}
		if (got) {
			w->received += got;
			last = now_s();
			pthread_mutex_lock(&lock);
			total += got;
			pthread_mutex_unlock(&lock);
			ioctl(d->fd, NIOCRXSYNC, NULL); /* give the slots back now */
		} else if (now_s() - last > (w->received ? idle_ms / 1e3 : 5.0) || now_s() - start > 60) {
			break;
		}
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 6) {
		fprintf(stderr, "usage: nm_recv PORT COUNT LEN THREADS IDLE_MS\n");
		return 2;
	}
	want_count = strtoul(argv[2], NULL, 0);
	want_len = (unsigned)strtoul(argv[3], NULL, 0);
	int threads = atoi(argv[4]);
	idle_ms = atoi(argv[5]);
	if (threads < 1 || threads > MAX_THREADS) {
		fprintf(stderr, "nm_recv: 1 to %d threads\n", MAX_THREADS);
		return 2;
	}
	struct worker w[MAX_THREADS];
	struct nmport_d *all = NULL;
	char spec[128];

	memset(w, 0, sizeof(w));
	if (threads == 1) {
		w[0].d = nmport_open(argv[1]);
	} else {
		snprintf(spec, sizeof(spec), "%s@conf:rings=%d", argv[1], threads);
		all = nmport_open(spec); /* creates the port with its rings */
		for (int i = 0; all && i < threads; i++) {
			snprintf(spec, sizeof(spec), "%s-%d", argv[1], i);
			w[i].d = nmport_open(spec);
			if (w[i].d == NULL)
				break;
		}
	}
	for (int i = 0; i < threads; i++) {
		if (w[i].d == NULL) {
			fprintf(stderr, "nm_recv: cannot open %s: %s\n", argv[1], strerror(errno));
			return 1;
		}
	}
	printf("ready\n");
	fflush(stdout);
	for (int i = 0; i < threads; i++)
		pthread_create(&w[i].tid, NULL, run, &w[i]);
	unsigned long received = 0, bad = 0;
	for (int i = 0; i < threads; i++) {
		pthread_join(w[i].tid, NULL);
		received += w[i].received;
		bad += w[i].bad;
	}
	printf("received %lu bad %lu rings", received, bad);
	for (int i = 0; i < threads; i++)
		printf("%c%lu", i ? ',' : ' ', w[i].received);
	printf("\n");
	for (int i = 0; i < threads; i++)
		nmport_close(w[i].d);
	nmport_close(all);
	return bad ? 1 : 0;
}
