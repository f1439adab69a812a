// deploy/ (fast lane): the Kubernetes manifests validated as the API server's schemas would
// (kubernetes-models: the JSON schemas of the Kubernetes OpenAPI, checked client-side — no
// cluster here), and checked against SPACE itself: the DaemonSet's arguments are flags spaced
// accepts (its own flag list, strictly), every $(VAR) they use is defined, every Secret and key
// it reads is in the example, no password is on a command line, the mounts agree with the data
// directory, the Service's ports name the container's, and kustomize lists every manifest.
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { describe, it } from 'node:test';
import { parseArgs } from 'node:util';
import { parseAllDocuments } from 'yaml';
import { DAEMON_OPTIONS } from '../packages/server/dist/flags.js';
import { parseS3Url } from '../packages/blob-s3/dist/index.js';

const DIR = new URL('../deploy/kubernetes/', import.meta.url);
const files = readdirSync(DIR).filter((f) => f.endsWith('.yaml'));
const docs = files.flatMap((file) =>
  parseAllDocuments(readFileSync(new URL(file, DIR), 'utf8')).map((d) => {
    assert.deepEqual(d.errors, [], `${file} is valid YAML`);
    return { file, obj: d.toJS() };
  }),
);
const of = (kind) => docs.filter((d) => d.obj.kind === kind).map((d) => d.obj);

/** Validates a manifest with the kubernetes-models class of its apiVersion and kind (throws when invalid). */
async function validate(obj) {
  const mod = await import(`kubernetes-models/${obj.apiVersion}`);
  const Model = mod[obj.kind];
  assert.ok(Model, `kubernetes-models knows ${obj.apiVersion} ${obj.kind}`);
  new Model(obj).validate();
}

describe('deploy/kubernetes', () => {
  it('every manifest is valid against the Kubernetes schemas (and the validator does refuse bad ones)', async () => {
    const k8s = docs.filter((d) => !d.obj.apiVersion.startsWith('kustomize.config.k8s.io/'));
    assert.deepEqual([...new Set(k8s.map((d) => d.obj.kind))].sort(), ['DaemonSet', 'Namespace', 'Secret', 'Service']);
    for (const { file, obj } of k8s) await validate(obj).catch((err) => assert.fail(`${file}: ${obj.kind} ${obj.metadata?.name}: ${err.message}`));
    // The check can fail: a port as text and a pod without containers are refused.
    const ds = structuredClone(of('DaemonSet')[0]);
    ds.spec.template.spec.containers[0].ports[0].containerPort = '7070';
    await assert.rejects(validate(ds), /containerPort must be integer/);
    delete ds.spec.template.spec.containers;
    await assert.rejects(validate(ds), /must have required property 'containers'|required property containers/);
  });

  it('kustomize applies every manifest but the Secrets example, all in one namespace', () => {
    const [k] = of('Kustomization');
    assert.deepEqual([...k.resources].sort(), files.filter((f) => f !== 'kustomization.yaml' && f !== 'secrets.example.yaml').sort());
    for (const { obj } of docs) if (obj.kind !== 'Namespace' && obj.kind !== 'Kustomization') assert.equal(obj.metadata.namespace, k.namespace, `${obj.kind} ${obj.metadata.name}`);
  });

  it("the DaemonSet's command line is one spaced accepts, with its variables defined and no password on it", () => {
    const [ds] = of('DaemonSet');
    const pod = ds.spec.template.spec;
    const [c] = pod.containers;
    const env = new Map(c.env.map((e) => [e.name, e]));
    // Kubernetes expands $(VAR) from the container's env; an undefined one stays as it is.
    const args = c.args.map((a) =>
      a.replace(/\$\(([A-Z_]+)\)/g, (_, name) => {
        assert.ok(env.has(name), `$(${name}) is defined in env`);
        return `value-of-${name.toLowerCase()}`;
      }),
    );
    const { values } = parseArgs({ options: DAEMON_OPTIONS, args, strict: true, allowPositionals: false });
    assert.ok(!('database' in values), 'the database URL (with its password) comes from SPACE_DATABASE, not argv');
    assert.ok(env.get('SPACE_DATABASE').valueFrom.secretKeyRef, 'SPACE_DATABASE from a Secret');
    assert.ok(!JSON.stringify(c.args).match(/password|secret_access|:\/\/[^/@]+:[^/@]+@/i), 'no credentials in the arguments');
    assert.equal(parseS3Url(values['blob-store']).bucket, 'space-blobs');
    assert.match(c.args.find((a) => a.startsWith('--advertise-url=')), /^--advertise-url=http:\/\/\$\(NODE_IP\):7070$/);
    assert.equal(env.get('NODE_IP').valueFrom.fieldRef.fieldPath, 'status.hostIP');
    assert.equal(env.get('NODE_NAME').valueFrom.fieldRef.fieldPath, 'spec.nodeName');
    assert.ok(values['ingress-domain'], 'every node the same ingress domain');
    // What the runtime needs of the host.
    assert.equal(c.securityContext.privileged, true);
    assert.equal(pod.hostNetwork, true);
    const mounts = new Map(c.volumeMounts.map((m) => [m.mountPath, m]));
    const volumes = new Map(pod.volumes.map((v) => [v.name, v]));
    assert.equal(volumes.get(mounts.get(values['data-dir']).name).hostPath.path, '/var/lib/space', 'the data directory is the host\'s');
    const keys = mounts.get(`${values['data-dir']}/keys`);
    assert.ok(keys?.readOnly, 'the key directory is mounted read-only where spaced reads it');
    assert.equal(volumes.get(keys.name).secret.secretName, 'space-keys');
    assert.equal(mounts.get('/run/netns').mountPropagation, 'Bidirectional', 'sandbox network namespaces visible to the host');
    for (const p of ['/dev/shm', '/sys/fs/cgroup']) assert.ok(volumes.get(mounts.get(p)?.name)?.hostPath, `${p} is the host's`);
    // Listeners: what the ports say.
    const port = (flag) => Number(values[flag].split(':').pop());
    assert.deepEqual(Object.fromEntries(c.ports.map((p) => [p.name, p.containerPort])), { api: port('listen'), e2b: port('e2b-listen'), ingress: port('ingress-listen') });
    assert.equal(c.readinessProbe.httpGet.path, '/v1/health');
  });

  it('every Secret and key the DaemonSet reads is in the example, and the Service reaches its pods', () => {
    const [ds] = of('DaemonSet');
    const pod = ds.spec.template.spec;
    const secrets = new Map(of('Secret').map((s) => [s.metadata.name, new Set(Object.keys({ ...s.data, ...s.stringData }))]));
    const c = pod.containers[0];
    for (const e of c.env) if (e.valueFrom?.secretKeyRef) assert.ok(secrets.get(e.valueFrom.secretKeyRef.name)?.has(e.valueFrom.secretKeyRef.key), `${e.name}: Secret ${e.valueFrom.secretKeyRef.name} has ${e.valueFrom.secretKeyRef.key}`);
    for (const e of c.envFrom) assert.deepEqual([...secrets.get(e.secretRef.name)].sort(), ['AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY']);
    for (const v of pod.volumes) if (v.secret) assert.ok(secrets.get(v.secret.secretName)?.has('node.key'), `Secret ${v.secret.secretName} holds node.key`);
    assert.deepEqual(ds.spec.selector.matchLabels, { 'app.kubernetes.io/name': ds.spec.template.metadata.labels['app.kubernetes.io/name'] });
    const [svc] = of('Service');
    for (const [k, v] of Object.entries(svc.spec.selector)) assert.equal(ds.spec.template.metadata.labels[k], v);
    const named = new Set(c.ports.map((p) => p.name));
    for (const p of svc.spec.ports) assert.ok(named.has(p.targetPort), `Service port ${p.name} → container port ${p.targetPort}`);
  });

  it('the image runs the daemon that `npm run build` makes', () => {
    const dockerfile = readFileSync(new URL('../deploy/Dockerfile', import.meta.url), 'utf8');
    const entry = JSON.parse(dockerfile.match(/^ENTRYPOINT (.*)$/m)[1]);
    assert.equal(entry[0], 'node');
    assert.ok(existsSync(new URL(`..${entry[1].replace('/opt/space', '')}`, import.meta.url)), `${entry[1]} is built`);
    const setup = readFileSync(new URL('../space', import.meta.url), 'utf8').match(/APT_PACKAGES=\(([^)]*)\)/)[1].split(/\s+/);
    for (const p of dockerfile.match(/install -y --no-install-recommends ([^&]*)/)[1].split(/[\s\\]+/).filter(Boolean)) assert.ok(setup.includes(p), `${p} is a package the set-up installs too`);
  });
});
