/*
 * nm_errno PORT: registers PORT with a plain NIOCCTRL request, as a netmap program does, and
 * prints "errno N" (0 when the port opened; it then holds it until stdin closes).  Exits 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <net/netmap.h>

#include "nm_common.h"

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: nm_errno PORT\n");
		return 2;
	}
	int fd = open("/dev/netmap", O_RDWR);
	if (fd < 0) {
		fprintf(stderr, "nm_errno: open /dev/netmap: %s\n", strerror(errno));
		return 1;
	}
	struct nmreq_header h;
	struct nmreq_register reg;

	register_request(&h, &reg, argv[1]);
	int r = ioctl(fd, NIOCCTRL, &h);
	printf("errno %d\n", r == 0 ? 0 : errno);
	fflush(stdout);
	if (r == 0) {
		char c;
		while (read(0, &c, 1) > 0)
			;
	}
	return 0;
}
