// The driver conformance suite on the microVM driver (real QEMU, software emulation on this
// machine: /dev/kvm exists but does not run guests). Skips, each with its reason:
import { conformance } from './conformance/suite.mjs';

conformance({
  name: 'microvm',
  daemonOpts: { driver: 'microvm', microvm: { cacheDir: process.env.SPACE_MICROVM_CACHE_DIR ?? '/var/cache/space/microvm' } },
  skip: [
    {
      test: 'exceeding the memory limit ends the sandbox as dead with reason oom',
      reason: 'the guest kernel enforces the memory size: its OOM killer ends the process that overran, and the sandbox lives on (the host cgroup only bounds the VMM)',
    },
  ],
});
