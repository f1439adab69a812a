/*
 * libspace-compat.so: fixes, inside a gVisor sandbox, the calls of stock Linux user space that
 * this runsc release (0.0~20221219) rejects. The gVisor driver lists it in the sandbox's
 * /etc/ld.so.preload (a read-only bind mount), so every dynamically linked glibc program loads
 * it; static programs (busybox, Go) do not need it. See docs/architecture.md, "gVisor
 * compatibility".
 *
 *   statx(2)  this runsc answers EINVAL to AT_NO_AUTOMOUNT, which coreutils (ls, stat, cp, du,
 *             ...) pass on every call. gVisor has no automounts, so the flag means nothing
 *             there: it is cleared and the call made as asked otherwise.
 *
 * Built with -nostdlib: it makes the system call itself and needs nothing from the C library
 * but __errno_location (glibc and musl both export it), so it loads into programs linked
 * against any glibc release, old or new.
 */
#define SPACE_SYS_STATX 332L /* x86_64 */
#define SPACE_AT_NO_AUTOMOUNT 0x800

extern int *__errno_location(void);

static long raw_statx(long dirfd, const char *path, long flags, long mask, void *buf) {
  long ret;
  register long r10 __asm__("r10") = mask;
  register long r8 __asm__("r8") = (long)buf;
  __asm__ volatile("syscall" : "=a"(ret) : "a"(SPACE_SYS_STATX), "D"(dirfd), "S"(path), "d"(flags), "r"(r10), "r"(r8) : "rcx", "r11", "memory");
  return ret;
}

__attribute__((visibility("default"))) int statx(int dirfd, const char *path, int flags, unsigned int mask, void *buf) {
  long r = raw_statx(dirfd, path, flags & ~SPACE_AT_NO_AUTOMOUNT, mask, buf);
  if (r < 0) {
    *__errno_location() = (int)-r;
    return -1;
  }
  return 0;
}
