// The frame codec treats its peer as hostile: oversized, malformed and unknown frames are refused.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { Channel, FrameKind, FrameReader, MAX_FRAME_BYTES, ProtocolError, encodeData, encodeJson, parseJson } from '../packages/protocol/dist/index.js';

describe('frame codec', () => {
  it('decodes frames split at every byte boundary and glued together', () => {
    const a = encodeJson(FrameKind.Request, 1, { op: 'ping' });
    const b = encodeData(1, Channel.Stdout, Buffer.from([0, 1, 2, 255]));
    const all = Buffer.concat([a, b]);
    for (let cut = 0; cut <= all.length; cut++) {
      const got = [];
      const r = new FrameReader((f) => got.push(f));
      r.push(all.subarray(0, cut));
      r.push(all.subarray(cut));
      assert.equal(got.length, 2);
      assert.deepEqual(parseJson(got[0].payload), { op: 'ping' });
      assert.deepEqual([...got[1].payload], [Channel.Stdout, 0, 1, 2, 255]);
    }
  });

  it('refuses a frame larger than the limit before buffering it', () => {
    const r = new FrameReader(() => {});
    const head = Buffer.alloc(9);
    head.writeUInt32BE(MAX_FRAME_BYTES + 10, 0);
    assert.throws(() => r.push(head), ProtocolError);
  });

  it('refuses unknown kinds, too-short lengths and non-object JSON', () => {
    const bad = encodeJson(FrameKind.Event, 0, {});
    bad.writeUInt8(99, 4);
    assert.throws(() => new FrameReader(() => {}).push(bad), ProtocolError);
    const short = Buffer.alloc(8);
    short.writeUInt32BE(2, 0);
    assert.throws(() => new FrameReader(() => {}).push(short), ProtocolError);
    assert.throws(() => parseJson(Buffer.from('[1,2]')), ProtocolError);
    assert.throws(() => parseJson(Buffer.from('{oops')), ProtocolError);
  });

  it('will not encode a frame over the limit', () => {
    assert.throws(() => encodeData(1, Channel.File, Buffer.alloc(MAX_FRAME_BYTES)), ProtocolError);
  });
});
