/*
 * vale_errno PORT: opens PORT with vale_open() and prints "errno N" (0 when it opened; it then
 * holds the port until stdin closes) and vale_last_error() on the next line.  Exits 0.
 */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <vale.h>

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: vale_errno PORT\n");
		return 2;
	}
	struct vale_port *p = vale_open(argv[1], NULL);
	printf("errno %d\n%s\n", p ? 0 : errno, p ? "" : vale_last_error());
	fflush(stdout);
	if (p) {
		char c;
		while (read(0, &c, 1) > 0)
			;
		vale_close(p);
	}
	return 0;
}
