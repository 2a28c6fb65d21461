/*
 * nm_wild PORT: netmap requests with wild pointers, each of which netmap answers with
 * EFAULT: a register request whose body (nr_body) or option list (nr_options) points at
 * 0x10, a header that ends in a guard page, a legacy NIOCREGIF / NIOCGINFO at 0x10, and a
 * register body in read-only memory.  Prints one line per case and exits 0 if all failed
 * with EFAULT.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <net/netmap.h>

#include "nm_common.h"

static int bad;

static void expect_efault(const char *what, int fd, unsigned long req, void *arg)
{
	errno = 0;
	int r = ioctl(fd, req, arg);
	int e = errno;
	printf("%s: %d %s\n", what, r, strerror(e));
	if (r != -1 || e != EFAULT)
		bad++;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: nm_wild PORT\n");
		return 2;
	}
	int fd = open("/dev/netmap", O_RDWR);
	if (fd < 0) {
		fprintf(stderr, "nm_wild: open /dev/netmap: %s\n", strerror(errno));
		return 1;
	}
	struct nmreq_header h;
	struct nmreq_register reg;

	register_request(&h, &reg, argv[1]);

	h.nr_body = 0x10;
	expect_efault("nr_body 0x10", fd, NIOCCTRL, &h);
	h.nr_body = (uintptr_t)&reg;
	h.nr_options = 0x10;
	expect_efault("nr_options 0x10", fd, NIOCCTRL, &h);
	h.nr_options = 0;

	long page = sysconf(_SC_PAGESIZE);
	char *two = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (two == MAP_FAILED || mprotect(two + page, (size_t)page, PROT_NONE) < 0)
		return 1;
	memcpy(two + page - 4, &h, 4);
	expect_efault("header 4 bytes before a guard page", fd, NIOCCTRL, two + page - 4);
	expect_efault("NIOCREGIF 0x10", fd, NIOCREGIF, (void *)0x10);
	expect_efault("NIOCGINFO 0x10", fd, NIOCGINFO, (void *)0x10);

	/* A body netmap cannot write its answer into. */
	memcpy(two, &reg, sizeof(reg));
	mprotect(two, (size_t)page, PROT_READ);
	h.nr_body = (uintptr_t)two;
	expect_efault("read-only body", fd, NIOCCTRL, &h);
	printf("%s\n", bad ? "some did not fail with EFAULT" : "all EFAULT");
	return bad ? 1 : 0;
}
