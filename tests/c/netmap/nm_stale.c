/*
 * nm_stale PORT HOW: opens PORT (nmport_open), then takes its descriptor's number away
 * behind libnetmap's back, as HOW says: "close_range" closes it with close_range() and
 * opens a pipe, which gets the number; "dup2" puts a pipe's read end over it with dup2();
 * "syscall" closes it with the raw system call and opens a pipe.  The pipe holds a byte:
 * poll() must say so at once, and mmap() of it must fail as for any pipe (ENODEV).  Prints
 * "poll R revents E mmap M" and exits 0 if both behave as for a pipe.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <libnetmap.h>

#include "nm_common.h"

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: nm_stale PORT close_range|dup2|syscall\n");
		return 2;
	}
	struct nmport_d *d = nmport_open(argv[1]);
	if (d == NULL) {
		fprintf(stderr, "nm_stale: nmport_open %s failed: %s\n", argv[1], strerror(errno));
		return 1;
	}
	int n = d->fd, p[2];
	if (strcmp(argv[2], "dup2") == 0) {
		if (pipe(p) < 0 || dup2(p[0], n) != n) {
			fprintf(stderr, "nm_stale: pipe/dup2: %s\n", strerror(errno));
			return 1;
		}
	} else {
		if (strcmp(argv[2], "close_range") == 0)
			close_range((unsigned)n, (unsigned)n, 0);
		else
			syscall(SYS_close, n);
		if (pipe(p) < 0 || p[0] != n) {
			fprintf(stderr, "nm_stale: the pipe got %d, not %d\n", p[0], n);
			return 1;
		}
	}
	if (write(p[1], "x", 1) != 1)
		return 1;
	struct pollfd pf = {.fd = n, .events = POLLIN};
	double t0 = now_s();
	int r = poll(&pf, 1, 1000);
	double waited = now_s() - t0;
	void *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, n, 0);
	int merr = m == MAP_FAILED ? errno : 0;
	printf("poll %d revents %d waited_ms %d mmap %s\n", r, pf.revents, (int)(waited * 1000),
	       m == MAP_FAILED ? strerror(merr) : "mapped");
	return r == 1 && (pf.revents & POLLIN) && m == MAP_FAILED && merr == ENODEV ? 0 : 1;
}
