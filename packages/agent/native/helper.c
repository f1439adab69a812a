/*
 * space-helper: the two things the in-sandbox agent (Node.js) cannot do itself.
 *
 *   space-helper sethostname NAME   set the UTS hostname (needs CAP_SYS_ADMIN, which only the
 *                                   agent holds)
 *   space-helper exec PROG ARGS...  drop CAP_SYS_ADMIN from every capability set, including
 *                                   the bounding set, then exec PROG: commands a client runs
 *                                   as root never hold it
 *   space-helper reseed             mix stdin (fresh entropy from the host) into the kernel's
 *                                   pool and reseed its CRNG at once (RNDRESEEDCRNG): a restored
 *                                   copy of a VM must not draw the numbers its siblings draw.
 *                                   A plain write to /dev/urandom only reaches the CRNG at its
 *                                   next periodic reseed (measured: two forks read equal bytes).
 *
 * Built statically so it runs in any root file system.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int drop_sys_admin(void) {
  if (prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) != 0 && errno != EINVAL) return -1;
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &hdr, data) != 0) return -1;
  unsigned mask = ~(1u << CAP_SYS_ADMIN);
  data[0].effective &= mask;
  data[0].permitted &= mask;
  data[0].inheritable &= mask;
  return (int)syscall(SYS_capset, &hdr, data);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "sethostname") == 0) {
    if (sethostname(argv[2], strlen(argv[2])) != 0) {
      perror("space-helper: sethostname");
      return 1;
    }
    return 0;
  }
  if (argc >= 3 && strcmp(argv[1], "exec") == 0) {
    if (drop_sys_admin() != 0) {
      perror("space-helper: dropping CAP_SYS_ADMIN");
      return 126;
    }
    execvp(argv[2], argv + 2);
    fprintf(stderr, "space-helper: cannot run %s: %s\n", argv[2], strerror(errno));
    return errno == ENOENT ? 127 : 126;
  }
  if (argc == 2 && strcmp(argv[1], "reseed") == 0) {
    unsigned char buf[512];
    ssize_t n = read(0, buf, sizeof buf);
    int fd = open("/dev/urandom", O_WRONLY);
    if (n <= 0 || fd < 0 || write(fd, buf, (size_t)n) != n) {
      perror("space-helper: mixing entropy into /dev/urandom");
      return 1;
    }
    if (ioctl(fd, RNDRESEEDCRNG) != 0) {
      perror("space-helper: RNDRESEEDCRNG");
      return 1;
    }
    return 0;
  }
  fprintf(stderr, "usage: space-helper sethostname NAME | space-helper exec PROG [ARGS...] | space-helper reseed < ENTROPY\n");
  return 2;
}
