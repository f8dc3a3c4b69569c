/* The pod sandbox ("pause") process: holds the pod's namespaces until it is told to stop.
 * Written here because no registry is reachable to pull one; built with `gcc -static`. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

/* As PID 1 of the sandbox it also reaps zombies of shared-PID-namespace pods. */
static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  signal(SIGINT, stop);
  signal(SIGTERM, stop);
  signal(SIGCHLD, reap);
  for (;;) pause();
  return 1;
}
