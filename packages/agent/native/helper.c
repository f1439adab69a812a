/*
 * space-helper: what the in-sandbox agent (Node.js) cannot do itself, and what this runsc's
 * kernel lacks (docs/architecture.md, "gVisor compatibility").
 *
 *   space-helper sethostname NAME [BOOT_ID]  set the UTS hostname (needs CAP_SYS_ADMIN, which
 *                                   only the agent holds); with BOOT_ID, also what kernelfiles
 *                                   BOOT_ID does
 *   space-helper exec PROG ARGS...  drop CAP_SYS_ADMIN from every capability set, including
 *                                   the bounding set, then exec PROG: commands a client runs
 *                                   as root never hold it
 *   space-helper reseed             mix stdin (fresh entropy from the host) into the kernel's
 *                                   pool and reseed its CRNG at once (RNDRESEEDCRNG): a restored
 *                                   copy of a VM must not draw the numbers its siblings draw.
 *                                   A plain write to /dev/urandom only reaches the CRNG at its
 *                                   next periodic reseed (measured: two forks read equal bytes).
 *   space-helper init -- PROG ARGS   pid 1 of a sandbox: runs the agent, reaps orphans.
 *   space-helper ptyexec PROG ARGS   a terminal's program where the runtime's terminals do not
 *                                   turn ^C, ^\\, ^Z into signals (this runsc): leaves a
 *                                   watcher in the session that does it when the agent asks.
 *   space-helper sudod               the sudo broker (this runsc never honours set-id bits);
 *                                   the same binary named `sudo` is its client.
 *   space-helper meta serve         file metadata (E2B's files.write(…, {metadata})), kept as
 *                                   extended attributes `user.space.meta.KEY` (`trusted.…` where
 *                                   the file system has no user attributes: the microVM's tmpfs).
 *                                   Node has no call for extended attributes, and a process a
 *                                   call costs ~25 ms in gVisor, so the agent keeps this one
 *                                   running and sends it requests (see meta_serve).
 *   space-helper kernelfiles BOOT_ID|new  where /proc/sys/kernel/random is missing (this runsc),
 *                                   makes it: /proc/sys/kernel becomes a tmpfs holding copies
 *                                   of the original entries and random/boot_id, entropy_avail,
 *                                   poolsize. With the directory present, only
 *                                   rewrites boot_id (a restored copy is a new boot).
 *   space-helper growfs DEVICE      grow the mounted ext4 file system on DEVICE to fill the
 *                                   device, online (EXT4_IOC_RESIZE_FS): a microVM restored
 *                                   from an image whose disk was smaller (the VMM grew the
 *                                   device first). The file system is mounted where the agent
 *                                   cannot name it (under the guest's old root), so it is
 *                                   mounted once more in a mount namespace of this process's
 *                                   own, which goes when it exits.
 *
 * Built statically so it runs in any root file system.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/random.h>
#include <grp.h>
#include <poll.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <termios.h>
#include <time.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <linux/fs.h>
#include <sched.h>
#include <unistd.h>

extern char **environ;

/* linux/ext4.h is not in every libc's headers: the ioctl's number from fs/ext4/ext4.h. */
#ifndef EXT4_IOC_RESIZE_FS
#define EXT4_IOC_RESIZE_FS _IOW('f', 16, uint64_t)
#endif

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

/*
 * What a kernel's line discipline does with control character BYTE typed on the terminal on
 * fd 0, for runtimes whose terminals do not (this runsc): if ISIG is on and BYTE is the
 * terminal's VINTR, VQUIT or VSUSP, signal the foreground process group (flushing pending input
 * unless NOFLSH) and return 1 (2 if ECHOCTL wants "^C" echoed); else 0: the byte goes in as
 * input. Must run in the terminal's session: this runsc answers TIOCGPGRP from anywhere else
 * (even the master) with ENOTTY.
 */
static int tty_signal(int byte) {
  struct termios t;
  if (tcgetattr(0, &t) != 0 || !(t.c_lflag & ISIG)) return 0;
  int sig = 0;
  if (t.c_cc[VINTR] != _POSIX_VDISABLE && byte == t.c_cc[VINTR]) sig = SIGINT;
  else if (t.c_cc[VQUIT] != _POSIX_VDISABLE && byte == t.c_cc[VQUIT]) sig = SIGQUIT;
  else if (t.c_cc[VSUSP] != _POSIX_VDISABLE && byte == t.c_cc[VSUSP]) sig = SIGTSTP;
  pid_t pgrp = sig ? tcgetpgrp(0) : -1;
  if (pgrp <= 0) return 0;
  if (!(t.c_lflag & NOFLSH)) tcflush(0, TCIFLUSH);
  kill(-pgrp, sig);
  return (t.c_lflag & ECHO) && (t.c_lflag & ECHOCTL) ? 2 : 1;
}

/*
 * The watcher: a process of the terminal's session in a background group of its own, which
 * the agent asks (over SOCK, after sending TOKEN) about each control character typed; it
 * answers one byte per question: '0' pass it on, '1' signalled, '2' signalled and echo it.
 * It ends when the agent closes the connection (the terminal's program has ended).
 */
static void pty_watch(const char *sockp, const char *token) {
  setpgid(0, 0);
  int ign[] = {SIGTTOU, SIGTTIN, SIGHUP, SIGINT, SIGQUIT, SIGTSTP, SIGPIPE};
  for (unsigned k = 0; k < sizeof ign / sizeof ign[0]; k++) signal(ign[k], SIG_IGN);
  int fd0 = dup(0);
  int devnull = open("/dev/null", O_RDWR);
  for (int i = 0; i < 1024; i++) if (i != fd0 && i != devnull) close(i);
  dup2(fd0, 0), close(fd0);
  if (devnull >= 0) dup2(devnull, 1), dup2(devnull, 2), close(devnull);
  int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", sockp);
  if (c < 0 || connect(c, (struct sockaddr *)&a, sizeof a) != 0) _exit(1);
  char hello[80];
  int n = snprintf(hello, sizeof hello, "%.64s\n", token);
  if (write(c, hello, (size_t)n) != n) _exit(1);
  unsigned char b;
  while (read(c, &b, 1) == 1) {
    char answer = (char)('0' + tty_signal(b));
    if (write(c, &answer, 1) != 1) break;
  }
  _exit(0);
}

/*
 * `ptyexec PROG ARGS...`: the program of a terminal, started this way by the agent where the
 * runtime's terminals do not signal. With SPACE_PTY_SOCK and SPACE_PTY_TOKEN set, it leaves a
 * watcher in the session (double fork: the program gets no extra child), then becomes PROG.
 */
static int ptyexec(char **argv) {
  const char *sockp = getenv("SPACE_PTY_SOCK"), *token = getenv("SPACE_PTY_TOKEN");
  if (sockp && token) {
    char sp[108], tk[80];
    snprintf(sp, sizeof sp, "%s", sockp);
    snprintf(tk, sizeof tk, "%s", token);
    pid_t mid = fork();
    if (mid == 0) {
      if (fork() == 0) pty_watch(sp, tk);
      _exit(0);
    }
    if (mid > 0) waitpid(mid, NULL, 0);
  }
  unsetenv("SPACE_PTY_SOCK");
  unsetenv("SPACE_PTY_TOKEN");
  execvp(argv[0], argv);
  fprintf(stderr, "space-helper: cannot run %s: %s\n", argv[0], strerror(errno));
  return errno == ENOENT ? 127 : 126;
}

/*
 * `init -- PROG ARGS...`: pid 1 of a sandbox. Runs PROG (the agent), reaps the orphans that
 * end (without it each one stays a zombie for good, holding a process slot), passes SIGTERM,
 * SIGINT, SIGHUP on to PROG, and exits as PROG does.
 */
#define INIT_REAPS_PER_S 20
static pid_t init_child = -1;
static void init_forward(int sig) {
  if (init_child > 0) kill(init_child, sig);
}
static int init_main(char **argv) {
  int fwd[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};
  init_child = fork();
  if (init_child < 0) {
    perror("space-helper: init");
    return 1;
  }
  if (init_child == 0) {
    execv(argv[0], argv);
    fprintf(stderr, "space-helper: init cannot run %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  for (unsigned k = 0; k < sizeof fwd / sizeof fwd[0]; k++) {
    struct sigaction sa = {.sa_handler = init_forward, .sa_flags = SA_RESTART};
    sigaction(fwd[k], &sa, NULL);
  }
  /* Orphans are reaped at most INIT_REAPS_PER_S a second. A daemonized server or `cmd &` makes
   * a few; a fork bomb makes thousands, and then its zombies fill RLIMIT_NPROC and stall it, as
   * a bomb must be stalled: reaped at once, it would keep that many live processes churning
   * until their memory ends the sandbox (measured: a 256 MiB sandbox died within 20 s). */
  time_t window = 0;
  int reaped = 0;
  for (;;) {
    int st;
    pid_t p = wait(&st);
    if (p == init_child) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (p < 0 && errno == ECHILD) return 1;
    if (p < 0) continue;
    time_t now = time(NULL);
    if (now != window) window = now, reaped = 0;
    if (++reaped >= INIT_REAPS_PER_S) {
      struct timespec pause = {1, 0};
      while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {}
    }
  }
}

static int write_file(const char *path, const char *text, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  if (fd < 0) return -1;
  ssize_t n = write(fd, text, strlen(text));
  close(fd);
  return n == (ssize_t)strlen(text) ? 0 : -1;
}

#define KERNEL_DIR "/proc/sys/kernel"
#define KERNEL_MARK KERNEL_DIR "/random/.space"

/* One entry of /proc/sys/kernel, read before the tmpfs covers it. */
struct kentry {
  char name[128];
  mode_t mode;
  int is_dir;
  char text[512];
};

static int read_small(const char *path, char *buf, size_t size) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n < 0) return -1;
  buf[n] = 0;
  return 0;
}

/*
 * This runsc's /proc/sys/kernel has no random/ and its mount(2) refuses MS_BIND, so the
 * originals cannot be bound back: their contents (constants, but for hostname, which
 * `sethostname` below keeps current) are read first and written to a tmpfs over the directory,
 * with random/boot_id beside them. Any failure once the tmpfs is mounted unmounts it again.
 */
/* A random (version 4) UUID from the kernel's generator, which each restored copy draws anew. */
static void new_uuid(char out[37]) {
  unsigned char b[16] = {0};
  if (syscall(SYS_getrandom, b, sizeof b, 0) != (long)sizeof b) {
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd >= 0) {
      (void)!read(fd, b, sizeof b);
      close(fd);
    }
  }
  b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
  b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
  snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* BOOT_ID "new": one drawn here (not by the agent: Node's generator lives in memory that every
 * fork of one snapshot shares, so two forks drew the same id — measured). */
static int kernelfiles(const char *boot_id) {
  char line[64], fresh[37];
  if (strcmp(boot_id, "new") == 0) {
    new_uuid(fresh);
    boot_id = fresh;
  }
  snprintf(line, sizeof line, "%.36s\n", boot_id);
  if (access(KERNEL_DIR "/random", F_OK) == 0) {
    /* Ours (a tmpfs file) if we made it; a kernel's own is left alone. */
    if (access(KERNEL_MARK, F_OK) == 0 && write_file(KERNEL_DIR "/random/boot_id", line, 0444) != 0) {
      perror("space-helper: rewriting boot_id");
      return 1;
    }
    return 0;
  }
  static struct kentry entries[96];
  int n = 0;
  DIR *d = opendir(KERNEL_DIR);
  if (!d) {
    perror("space-helper: reading " KERNEL_DIR);
    return 1;
  }
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < 64) {
    if (e->d_name[0] == '.') continue;
    struct kentry *k = &entries[n];
    snprintf(k->name, sizeof k->name, "%.100s", e->d_name);
    char path[300];
    snprintf(path, sizeof path, KERNEL_DIR "/%.127s", k->name);
    struct stat st;
    if (stat(path, &st) != 0) continue;
    k->mode = st.st_mode & 0777;
    k->is_dir = S_ISDIR(st.st_mode);
    k->text[0] = 0;
    if (!k->is_dir && (st.st_mode & 0444)) read_small(path, k->text, sizeof k->text);
    n++;
    if (k->is_dir) { /* one level down (yama/ptrace_scope) */
      char dir[128];
      snprintf(dir, sizeof dir, "%s", k->name);
      DIR *sub = opendir(path);
      struct dirent *se;
      while (sub && (se = readdir(sub)) != NULL && n < 96) {
        if (se->d_name[0] == '.') continue;
        struct kentry *c = &entries[n];
        snprintf(c->name, sizeof c->name, "%.60s/%.60s", dir, se->d_name);
        char sp[300];
        snprintf(sp, sizeof sp, KERNEL_DIR "/%.127s", c->name);
        if (stat(sp, &st) != 0 || S_ISDIR(st.st_mode)) continue;
        c->mode = st.st_mode & 0777;
        c->is_dir = 0;
        c->text[0] = 0;
        read_small(sp, c->text, sizeof c->text);
        n++;
      }
      if (sub) closedir(sub);
    }
  }
  closedir(d);
  if (mount("space-kernel", KERNEL_DIR, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0555,size=256k") != 0) {
    perror("space-helper: mounting a tmpfs on " KERNEL_DIR);
    return 1;
  }
  char path[300];
  for (int i = 0; i < n; i++) {
    snprintf(path, sizeof path, KERNEL_DIR "/%.127s", entries[i].name);
    if (entries[i].is_dir ? mkdir(path, 0555) : write_file(path, entries[i].text, entries[i].mode)) goto undo;
    if (!entries[i].is_dir) chmod(path, entries[i].mode);
  }
  if (mkdir(KERNEL_DIR "/random", 0555) != 0 || write_file(KERNEL_DIR "/random/boot_id", line, 0444) ||
      write_file(KERNEL_DIR "/random/entropy_avail", "256\n", 0444) || write_file(KERNEL_DIR "/random/poolsize", "256\n", 0444) ||
      write_file(KERNEL_MARK, "", 0400))
    goto undo;
  chmod(KERNEL_DIR "/random/boot_id", 0444);
  return 0;
undo:
  perror("space-helper: making /proc/sys/kernel/random");
  umount2(KERNEL_DIR, MNT_DETACH);
  return 1;
}

/* ---- sudo, where set-id programs do not work (this runsc never honours the set-id bits) ---- */

#define SUDO_SOCK "/run/space-sudo.sock"
#define SUDO_MAX (256 * 1024)

/* Looks NAME (or #UID, or a number) up in /etc/passwd. */
static int lookup_user(const char *who, uid_t *uid, gid_t *gid, char *name, size_t nsize, char *home, size_t hsize, char *shell, size_t ssize) {
  FILE *f = fopen("/etc/passwd", "r");
  char buf[1024];
  int by_uid = who[0] == '#' || (who[0] >= '0' && who[0] <= '9');
  long want = by_uid ? strtol(who + (who[0] == '#'), NULL, 10) : -1;
  while (f && fgets(buf, sizeof buf, f)) {
    char *fields[7] = {0};
    char *p = buf;
    for (int i = 0; i < 7 && p; i++) {
      fields[i] = p;
      p = strchr(p, ':');
      if (p) *p++ = 0;
    }
    if (!fields[6]) continue;
    fields[6][strcspn(fields[6], "\n")] = 0;
    if (by_uid ? strtol(fields[2], NULL, 10) != want : strcmp(fields[0], who) != 0) continue;
    *uid = (uid_t)strtol(fields[2], NULL, 10);
    *gid = (gid_t)strtol(fields[3], NULL, 10);
    snprintf(name, nsize, "%s", fields[0]);
    snprintf(home, hsize, "%s", fields[5][0] ? fields[5] : "/");
    snprintf(shell, ssize, "%s", fields[6][0] ? fields[6] : "/bin/sh");
    fclose(f);
    return 0;
  }
  if (f) fclose(f);
  return -1;
}

/* The gid of group `sudo` and whether NAME (primary gid PGID) is in it. */
static int in_sudo_group(const char *name, gid_t pgid, gid_t *sudo_gid) {
  FILE *f = fopen("/etc/group", "r");
  char buf[4096];
  int found = -1;
  while (f && fgets(buf, sizeof buf, f)) {
    if (strncmp(buf, "sudo:", 5) != 0) continue;
    char *gidp = strchr(buf + 5, ':');
    if (!gidp) break;
    gidp++;
    *sudo_gid = (gid_t)strtol(gidp, NULL, 10);
    found = 0;
    char *members = strchr(gidp, ':');
    if (pgid == *sudo_gid) found = 1;
    if (members && name) {
      members++;
      members[strcspn(members, "\n")] = 0;
      for (char *m = strtok(members, ","); m; m = strtok(NULL, ","))
        if (strcmp(m, name) == 0) found = 1;
    }
    break;
  }
  if (f) fclose(f);
  return found;
}

static int read_full(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

/*
 * One request (after the broker's "g"): [u32 length][strings: target, cwd, mode (c|i|s), keepenv (0|1), argc, argv..., env...]
 * with the client's fds 0, 1, 2 attached. Runs the command as the target in a session of its
 * own, forwards the signal numbers the client sends (one byte each), answers a u32 status.
 */
static void sudo_serve(int c) {
  /* Who is asking: the kernel's SCM_CREDENTIALS on the first message (a process cannot claim
   * another uid there: EPERM). Not SO_PEERCRED: this runsc answers it with the listener's own
   * credentials (measured), which would make everyone root. */
  /* A client that connects and never sends must not hold a root process: 10 s to ask. */
  struct timeval ask = {10, 0};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &ask, sizeof ask);
  int on = 1;
  /* Set before the client sends (it waits for the "g"): a message sent earlier carries
   * placeholder credentials in this runsc (pid 0, the overflow uid), refused below. */
  if (setsockopt(c, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0 || write(c, "g", 1) != 1) _exit(1);
  uint32_t len = 0;
  int fds[3] = {-1, -1, -1};
  struct ucred cred;
  int have_cred = 0;
  char cbuf[CMSG_SPACE(sizeof fds) + CMSG_SPACE(sizeof cred)];
  struct iovec iov = {&len, sizeof len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  if (recvmsg(c, &msg, MSG_WAITALL) != sizeof len || len == 0 || len > SUDO_MAX) _exit(1);
  for (struct cmsghdr *h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h)) {
    if (h->cmsg_level != SOL_SOCKET) continue;
    if (h->cmsg_type == SCM_RIGHTS && h->cmsg_len == CMSG_LEN(sizeof fds)) memcpy(fds, CMSG_DATA(h), sizeof fds);
    if (h->cmsg_type == SCM_CREDENTIALS && h->cmsg_len == CMSG_LEN(sizeof cred)) memcpy(&cred, CMSG_DATA(h), sizeof cred), have_cred = 1;
  }
  if (!have_cred || cred.pid <= 0 || fds[2] < 0) _exit(1);
  char cname[256], chome[512], cshell[256];
  uid_t cuid;
  gid_t cgid, sgid = 0;
  char who[32];
  snprintf(who, sizeof who, "#%u", (unsigned)cred.uid);
  int allowed = cred.uid == 0 || (lookup_user(who, &cuid, &cgid, cname, sizeof cname, chome, sizeof chome, cshell, sizeof cshell) == 0 && in_sudo_group(cname, cgid, &sgid) == 1);
  if (!allowed && cred.uid != 0 && lookup_user(who, &cuid, &cgid, cname, sizeof cname, chome, sizeof chome, cshell, sizeof cshell) != 0) snprintf(cname, sizeof cname, "uid %u", (unsigned)cred.uid);
  char *buf = malloc(len + 1);
  if (!buf || read_full(c, buf, len) != 0) _exit(1);
  buf[len] = 0;
  uint32_t status = 1;
  if (!allowed) {
    dprintf(fds[2], "sudo: %s is not in the sudo group (SPACE's sudo admits root and members of group sudo)\n", cred.uid == 0 ? "root" : cname);
    (void)!write(c, &status, sizeof status);
    _exit(0);
  }
  char *strs[8200];
  int ns = 0;
  for (char *p = buf; p < buf + len && ns < 8200; p += strlen(p) + 1) strs[ns++] = p;
  if (ns < 5) _exit(1);
  const char *target = strs[0], *cwd = strs[1], mode = strs[2][0];
  int keepenv = strs[3][0] == '1', argc = atoi(strs[4]);
  if (argc < 0 || 5 + argc > ns) _exit(1);
  uid_t tuid;
  gid_t tgid;
  char tname[256], thome[512], tshell[256];
  if (lookup_user(target, &tuid, &tgid, tname, sizeof tname, thome, sizeof thome, tshell, sizeof tshell) != 0) {
    dprintf(fds[2], "sudo: unknown user %s\n", target);
    (void)!write(c, &status, sizeof status);
    _exit(0);
  }
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  pid_t pid = fork();
  if (pid == 0) {
    sigprocmask(SIG_UNBLOCK, &mask, NULL);
    setsid();
    for (int i = 0; i < 3; i++) dup2(fds[i], i);
    for (int i = 3; i < 1024; i++) close(i);
    if (setgroups(1, &tgid) != 0 || setgid(tgid) != 0 || setuid(tuid) != 0) {
      perror("sudo: switching user");
      _exit(1);
    }
    static char *env[8300];
    int ne = 0;
    static char e_home[600], e_user[300], e_logname[300], e_shell[300], e_suser[300], e_suid[40], e_sgid[40];
    for (int i = 5 + argc; i < ns && ne < 8200; i++) {
      const char *v = strs[i];
      int keep = keepenv || !strncmp(v, "TERM=", 5) || !strncmp(v, "LANG=", 5) || !strncmp(v, "LC_", 3) || !strncmp(v, "COLORTERM=", 10) ||
                 !strncmp(v, "DISPLAY=", 8) || !strncmp(v, "TZ=", 3);
      if (keep && strncmp(v, "HOME=", 5) && strncmp(v, "USER=", 5) && strncmp(v, "LOGNAME=", 8) && strncmp(v, "SHELL=", 6) && strncmp(v, "SUDO_", 5) &&
          (keepenv || strncmp(v, "PATH=", 5)))
        env[ne++] = strs[i];
    }
    snprintf(e_home, sizeof e_home, "HOME=%s", thome);
    snprintf(e_user, sizeof e_user, "USER=%s", tname);
    snprintf(e_logname, sizeof e_logname, "LOGNAME=%s", tname);
    snprintf(e_shell, sizeof e_shell, "SHELL=%s", tshell);
    snprintf(e_suser, sizeof e_suser, "SUDO_USER=%s", cred.uid == 0 ? "root" : cname);
    snprintf(e_suid, sizeof e_suid, "SUDO_UID=%u", (unsigned)cred.uid);
    snprintf(e_sgid, sizeof e_sgid, "SUDO_GID=%u", (unsigned)cred.gid);
    env[ne++] = e_home, env[ne++] = e_user, env[ne++] = e_logname, env[ne++] = e_shell;
    env[ne++] = e_suser, env[ne++] = e_suid, env[ne++] = e_sgid;
    if (!keepenv) env[ne++] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    env[ne] = NULL;
    environ = env;
    if (mode == 'i' ? chdir(thome) : chdir(cwd)) (void)!chdir("/");
    char **argv = &strs[5];
    argv[argc] = NULL;
    if (mode == 'i' || mode == 's' || argc == 0) {
      static char *sh[8200];
      int k = 0;
      sh[k++] = tshell;
      if (mode == 'i') sh[k++] = "-l";
      if (argc > 0) {
        static char joined[SUDO_MAX];
        size_t o = 0;
        for (int i = 0; i < argc; i++) o += (size_t)snprintf(joined + o, sizeof joined - o, "%s%s", i ? " " : "", argv[i]);
        sh[k++] = "-c";
        sh[k++] = joined;
      }
      sh[k] = NULL;
      execv(tshell, sh);
      fprintf(stderr, "sudo: %s: %s\n", tshell, strerror(errno));
      _exit(127);
    }
    execvp(argv[0], argv);
    fprintf(stderr, "sudo: %s: %s\n", argv[0], strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  for (int i = 0; i < 3; i++) close(fds[i]);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
  struct pollfd pf[2] = {{c, POLLIN, 0}, {sfd, POLLIN, 0}};
  int client_open = 1;
  for (;;) {
    int wst;
    if (waitpid(pid, &wst, WNOHANG) == pid) {
      status = WIFEXITED(wst) ? (uint32_t)WEXITSTATUS(wst) : 128u + (uint32_t)WTERMSIG(wst);
      break;
    }
    pf[0].fd = client_open ? c : -1;
    if (poll(pf, 2, -1) < 0 && errno != EINTR) break;
    if (pf[1].revents & POLLIN) {
      struct signalfd_siginfo si;
      (void)!read(sfd, &si, sizeof si);
    }
    if (client_open && (pf[0].revents & (POLLIN | POLLHUP))) {
      unsigned char sig;
      if (read(c, &sig, 1) == 1) {
        if (sig > 0 && sig < 32) kill(-pid, sig);
      } else {
        client_open = 0;
        kill(-pid, SIGHUP);
      }
    }
  }
  (void)!write(c, &status, sizeof status);
  _exit(0);
}

/* The broker: started by the agent (as root) where the image has sudo and group sudo. */
static int sudod(void) {
  gid_t sgid = 0;
  if (in_sudo_group(NULL, (gid_t)-1, &sgid) < 0) return 0; /* no group sudo: nobody to serve */
  if (drop_sys_admin() != 0) return 1;
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", SUDO_SOCK);
  unlink(SUDO_SOCK);
  /* Anyone may connect: each request's peer is checked against group sudo in /etc/group
   * (SO_PEERCRED), since the agent's processes carry no supplementary groups. */
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || chmod(SUDO_SOCK, 0666) != 0 || listen(s, 16) != 0) {
    perror("space-helper: sudo socket");
    return 1;
  }
  signal(SIGCHLD, SIG_IGN); /* handlers are reaped by the kernel */
  for (;;) {
    int c = accept4(s, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) continue;
    if (fork() == 0) {
      signal(SIGCHLD, SIG_DFL);
      close(s);
      sudo_serve(c);
    }
    close(c);
  }
}

static int sudo_sock = -1;
static void forward(int sig) {
  unsigned char b = (unsigned char)sig;
  (void)!write(sudo_sock, &b, 1);
  if (sig == SIGTSTP) raise(SIGSTOP);
}

static int sudo_usage(void) {
  fprintf(stderr, "usage: sudo [-u user] [-E] [-H] [-n] [-i | -s] [--] [command [args...]]\n");
  return 1;
}

/* The client, installed as the image's /usr/bin/sudo: sudo's everyday options, no password. */
static int sudo_main(int argc, char **argv) {
  const char *target = "root";
  char mode = 'c';
  int keepenv = 0, i = 1;
  for (; i < argc && argv[i][0] == '-' && argv[i][1]; i++) {
    if (!strcmp(argv[i], "--")) { i++; break; }
    if (!strcmp(argv[i], "-V") || !strcmp(argv[i], "--version")) { puts("sudo (SPACE sandbox broker)"); return 0; }
    if (!strcmp(argv[i], "-l") || !strcmp(argv[i], "--list")) { puts("User may run the following commands in this sandbox:\n    (ALL : ALL) NOPASSWD: ALL"); return 0; }
    if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "-k") || !strcmp(argv[i], "-K")) return 0;
    for (const char *f = argv[i] + 1; *f; f++) {
      if (*f == 'u') {
        if (f[1]) { target = f + 1; break; }
        if (i + 1 >= argc) return sudo_usage();
        target = argv[++i];
        break;
      } else if (*f == 'E') keepenv = 1;
      else if (*f == 'i') mode = 'i';
      else if (*f == 's') mode = 's';
      else if (*f == 'H' || *f == 'n' || *f == 'S' || *f == 'P' || *f == 'A' || *f == 'b') continue;
      else return sudo_usage();
    }
  }
  if (i >= argc && mode == 'c') return sudo_usage();
  static char buf[SUDO_MAX];
  size_t o = 4;
  char cwd[4096];
  if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "/");
  char argcs[16], modes[2] = {mode, 0};
  snprintf(argcs, sizeof argcs, "%d", argc - i);
  const char *head[] = {target, cwd, modes, keepenv ? "1" : "0", argcs};
  for (int k = 0; k < 5; k++) o += (size_t)snprintf(buf + o, sizeof buf - o, "%s", head[k]) + 1;
  for (int k = i; k < argc; k++) {
    if (o + strlen(argv[k]) + 1 > sizeof buf) { fprintf(stderr, "sudo: arguments too long\n"); return 1; }
    memcpy(buf + o, argv[k], strlen(argv[k]) + 1), o += strlen(argv[k]) + 1;
  }
  for (char **e = environ; *e && o + strlen(*e) + 1 < sizeof buf; e++) memcpy(buf + o, *e, strlen(*e) + 1), o += strlen(*e) + 1;
  uint32_t len = (uint32_t)(o - 4);
  memcpy(buf, &len, 4);
  sudo_sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", SUDO_SOCK);
  if (connect(sudo_sock, (struct sockaddr *)&a, sizeof a) != 0) {
    fprintf(stderr, "sudo: this sandbox has no sudo service (%s): run the command as root through SPACE instead (space exec -u root)\n", strerror(errno));
    return 1;
  }
  char go;
  if (read(sudo_sock, &go, 1) != 1 || go != 'g') { fprintf(stderr, "sudo: the sudo service did not answer\n"); return 1; }
  int fds[3] = {0, 1, 2};
  char cbuf[CMSG_SPACE(sizeof fds)];
  memset(cbuf, 0, sizeof cbuf);
  struct iovec iov = {buf, 4};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  struct cmsghdr *h = CMSG_FIRSTHDR(&msg);
  h->cmsg_level = SOL_SOCKET, h->cmsg_type = SCM_RIGHTS, h->cmsg_len = CMSG_LEN(sizeof fds);
  memcpy(CMSG_DATA(h), fds, sizeof fds);
  if (sendmsg(sudo_sock, &msg, 0) != 4) { perror("sudo: sending the request"); return 1; }
  for (size_t sent = 4; sent < o;) {
    ssize_t w = write(sudo_sock, buf + sent, o - sent);
    if (w <= 0) { perror("sudo: sending the request"); return 1; }
    sent += (size_t)w;
  }
  int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH, SIGTSTP, SIGCONT};
  for (unsigned k = 0; k < sizeof sigs / sizeof sigs[0]; k++) {
    struct sigaction sa = {.sa_handler = forward, .sa_flags = SA_RESTART};
    sigaction(sigs[k], &sa, NULL);
  }
  uint32_t status;
  if (read_full(sudo_sock, &status, sizeof status) != 0) { fprintf(stderr, "sudo: the sudo service went away\n"); return 1; }
  return (int)status;
}

/* ---- meta: file metadata as extended attributes ---- */
#define META_USER "user.space.meta."
#define META_TRUSTED "trusted.space.meta."

/* Prints `s` as a JSON string; the caller has checked it is printable ASCII. */
static void json_string(const char *s, size_t n) {
  putchar('"');
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '"' || s[i] == '\\') putchar('\\');
    putchar(s[i]);
  }
  putchar('"');
}

static int printable(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) if (s[i] < 0x20 || s[i] > 0x7e) return 0;
  return 1;
}

static void meta_print(const char *path) {
  char names[65536], value[65536];
  ssize_t len = llistxattr(path, names, sizeof names);
  int first = 1;
  putchar('{');
  for (ssize_t off = 0; len > 0 && off < len; off += (ssize_t)strlen(names + off) + 1) {
    const char *name = names + off, *key;
    if (strncmp(name, META_USER, strlen(META_USER)) == 0) key = name + strlen(META_USER);
    else if (strncmp(name, META_TRUSTED, strlen(META_TRUSTED)) == 0) key = name + strlen(META_TRUSTED);
    else continue;
    ssize_t vlen = lgetxattr(path, name, value, sizeof value);
    if (vlen < 0 || !*key || !printable(key, strlen(key)) || !printable(value, (size_t)vlen)) continue;
    if (!first) putchar(',');
    first = 0;
    json_string(key, strlen(key));
    putchar(':');
    json_string(value, (size_t)vlen);
  }
  puts("}");
}

/* One NUL-terminated field of a request; NULL at the end of input. */
static char *meta_field(char **buf, size_t *cap) {
  ssize_t n = getdelim(buf, cap, '\0', stdin);
  return n <= 0 ? NULL : *buf;
}

/* Requests on stdin, one reply line each on stdout, until stdin closes:
 *   g\0PATH\0                      -> the metadata as one JSON object
 *   s\0PATH\0N\0K1\0V1\0…KN\0VN\0  -> "ok", or "error: …" (keys set in order up to the failure) */
static int meta_serve(void) {
  char *op = NULL, *path = NULL, *key = NULL, *value = NULL, *count = NULL;
  size_t opc = 0, pathc = 0, keyc = 0, valuec = 0, countc = 0;
  for (;;) {
    if (!meta_field(&op, &opc) || !meta_field(&path, &pathc)) return 0;
    if (strcmp(op, "g") == 0) {
      meta_print(path);
    } else if (strcmp(op, "s") == 0) {
      if (!meta_field(&count, &countc)) return 2;
      long n = strtol(count, NULL, 10);
      const char *failed = NULL;
      int err = 0;
      for (long i = 0; i < n; i++) {
        if (!meta_field(&key, &keyc) || !meta_field(&value, &valuec)) return 2;
        if (failed) continue;
        char name[512];
        if (snprintf(name, sizeof name, META_USER "%s", key) >= (int)sizeof name) { failed = "key too long"; continue; }
        if (lsetxattr(path, name, value, strlen(value), 0) == 0) continue;
        if (errno == ENOTSUP) {
          snprintf(name, sizeof name, META_TRUSTED "%s", key);
          if (lsetxattr(path, name, value, strlen(value), 0) == 0) continue;
        }
        err = errno;
        failed = strerror(err);
      }
      if (failed) printf("error: %s\n", failed);
      else puts("ok");
    } else {
      return 2;
    }
    if (fflush(stdout) != 0) return 1;
  }
}

/* See the usage at the top. The mount point is the runtime's directory, hidden only in this
 * process's namespace; a second mount of a mounted ext4 device is the same file system. */
static int growfs(const char *device) {
  int dev = open(device, O_RDONLY | O_CLOEXEC);
  uint64_t bytes = 0;
  if (dev < 0 || ioctl(dev, BLKGETSIZE64, &bytes) != 0) {
    fprintf(stderr, "space-helper: the size of %s: %s\n", device, strerror(errno));
    return 1;
  }
  close(dev);
  if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) {
    perror("space-helper: a mount namespace of its own");
    return 1;
  }
  if (mount(device, "/.space", "ext4", MS_NOATIME, NULL) != 0) {
    fprintf(stderr, "space-helper: mounting %s: %s\n", device, strerror(errno));
    return 1;
  }
  int fd = open("/.space", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  struct statfs sf;
  if (fd < 0 || fstatfs(fd, &sf) != 0 || sf.f_bsize <= 0) {
    perror("space-helper: the file system's block size");
    return 1;
  }
  uint64_t blocks = bytes / (uint64_t)sf.f_bsize;
  if (ioctl(fd, EXT4_IOC_RESIZE_FS, &blocks) != 0) {
    fprintf(stderr, "space-helper: growing the file system on %s to %llu blocks: %s\n", device, (unsigned long long)blocks, strerror(errno));
    return 1;
  }
  printf("%llu\n", (unsigned long long)(blocks * (uint64_t)sf.f_bsize));
  return fflush(stdout) == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  const char *base = strrchr(argv[0], '/');
  if (strcmp(base ? base + 1 : argv[0], "sudo") == 0) return sudo_main(argc, argv);
  if (argc == 2 && strcmp(argv[1], "sudod") == 0) return sudod();
  if ((argc == 3 || argc == 4) && strcmp(argv[1], "sethostname") == 0) {
    if (sethostname(argv[2], strlen(argv[2])) != 0) {
      perror("space-helper: sethostname");
      return 1;
    }
    /* Where /proc/sys/kernel is our tmpfs (see kernelfiles), its hostname file follows, and a
     * new identity's BOOT_ID is written in the same call (one process start, not two). */
    char line[80];
    snprintf(line, sizeof line, "%.64s\n", argv[2]);
    if (access(KERNEL_MARK, F_OK) == 0) write_file(KERNEL_DIR "/hostname", line, 0644);
    return argc == 4 ? kernelfiles(argv[3]) : 0;
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
  if (argc >= 4 && strcmp(argv[1], "init") == 0 && strcmp(argv[2], "--") == 0) return init_main(argv + 3);
  if (argc >= 3 && strcmp(argv[1], "ptyexec") == 0) return ptyexec(argv + 2);
  if (argc == 3 && strcmp(argv[1], "kernelfiles") == 0) return kernelfiles(argv[2]);
  if (argc == 3 && strcmp(argv[1], "meta") == 0 && strcmp(argv[2], "serve") == 0) return meta_serve();
  if (argc == 3 && strcmp(argv[1], "growfs") == 0) return growfs(argv[2]);
  fprintf(stderr, "usage: space-helper sethostname NAME [BOOT_ID] | exec PROG [ARGS...] | reseed < ENTROPY | init -- PROG [ARGS...] | ptyexec PROG [ARGS...] | kernelfiles BOOT_ID | sudod | meta serve | growfs DEVICE\n");
  return 2;
}
