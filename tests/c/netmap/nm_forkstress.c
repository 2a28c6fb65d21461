/*
 * nm_forkstress N: forks N children while another thread opens and closes netmap
 * descriptors without pause; each child closes an inherited netmap descriptor and exits.
 * A child that has not exited within 5 s is hung (a lock held across fork): it is killed and
 * counted.  Prints "hung H of N" and exits 0 if none hung.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nm_common.h"

static volatile int stop;

static void *churn(void *arg)
{
	(void)arg;
	while (!stop) {
		int fd = open("/dev/netmap", O_RDWR);
		if (fd >= 0)
			close(fd);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: nm_forkstress N\n");
		return 2;
	}
	int n = atoi(argv[1]), hung = 0;
	int nmfd = open("/dev/netmap", O_RDWR);
	if (nmfd < 0) {
		fprintf(stderr, "nm_forkstress: open /dev/netmap: %s\n", strerror(errno));
		return 1;
	}
	pthread_t t;
	pthread_create(&t, NULL, churn, NULL);
	for (int i = 0; i < n; i++) {
		pid_t pid = fork();
		if (pid < 0) {
			fprintf(stderr, "nm_forkstress: fork: %s\n", strerror(errno));
			break;
		}
		if (pid == 0) {
			close(nmfd);
			_exit(0);
		}
		double end = now_s() + 5;
		int st;
		while (waitpid(pid, &st, WNOHANG) == 0) {
			if (now_s() > end) {
				hung++;
				kill(pid, SIGKILL);
				waitpid(pid, &st, 0);
				break;
			}
			usleep(200);
		}
	}
	stop = 1;
	pthread_join(t, NULL);
	printf("hung %d of %d\n", hung, n);
	return hung ? 1 : 0;
}
