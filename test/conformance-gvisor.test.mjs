// The driver conformance suite on gVisor (real runsc). No skips.
import { conformance } from './conformance/suite.mjs';

conformance({ name: 'gvisor', skip: [] });
