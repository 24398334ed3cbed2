// The VS Code extension's plain-Node parts, without VS Code, in a second: when a restart onto an updated
// server environment may go (inFlight.ts: no request in flight, and a quiet moment after the last), and
// what another window's lock on that environment looks like (lockFile.ts). Node 24 runs the TypeScript
// sources as they are (type stripping); run by test_editors.py:
//   node --disable-warning=MODULE_TYPELESS_PACKAGE_JSON clients/tests/vscode_logic_test.mjs
// Exits 0, or 1 with the failed check.
import assert from 'node:assert/strict';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { InFlight } from '../vscode/src/inFlight.ts';
import { heldByAnother, tryLock } from '../vscode/src/lockFile.ts';

// A clock whose sleep moves time on at once, running the events scheduled meanwhile at their time.
function fakeClock() {
  let t = 0;
  const events = [];
  return {
    now: () => t,
    sleep(ms) {
      const until = t + ms;
      events.sort((a, b) => a.at - b.at);
      while (events.length && events[0].at <= until) {
        const e = events.shift();
        t = e.at;
        e.fn();
      }
      t = until;
      return Promise.resolve();
    },
    at(ms, fn) {
      events.push({ at: ms, fn });
    },
  };
}

const QUIET = 2000;
const checks = [];
function check(name, fn) {
  checks.push({ name, fn });
}

check('idle for longer than the pause: at once', async () => {
  const clock = fakeClock();
  const requests = new InFlight(clock);
  await clock.sleep(5000);
  assert.equal(await requests.quiet(QUIET), true);
  assert.equal(clock.now(), 5000);
});

check('a request in flight: not before it ended and a pause passed', async () => {
  const clock = fakeClock();
  const requests = new InFlight(clock);
  requests.started();
  clock.at(1500, () => requests.ended());
  assert.equal(await requests.quiet(QUIET), true);
  assert.equal(requests.pending(), 0);
  assert.equal(clock.now(), 1500 + QUIET);
});

check('a request asked for during the pause starts it again', async () => {
  const clock = fakeClock();
  const requests = new InFlight(clock);
  requests.started();
  requests.started(); // inline and completion items at one position
  clock.at(300, () => requests.ended());
  clock.at(900, () => requests.ended());
  clock.at(2500, () => requests.started()); // the next keystroke, within the pause
  clock.at(2600, () => requests.ended());
  assert.equal(await requests.quiet(QUIET), true);
  assert.equal(clock.now(), 2600 + QUIET);
});

check('a window closing stops the wait', async () => {
  const clock = fakeClock();
  const requests = new InFlight(clock);
  requests.started();
  let closing = false;
  clock.at(10_000, () => (closing = true));
  assert.equal(await requests.quiet(QUIET, () => closing), false);
  assert.equal(requests.pending(), 1);
});

check("another window's lock: held while its process lives, not our own, not a dead one's", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'specdec-lock-'));
  try {
    const file = path.join(dir, 'server-env.lock');
    assert.equal(heldByAnother(file), false, 'no lock file');
    const lock = tryLock(file);
    assert.ok(lock);
    assert.equal(heldByAnother(file), false, 'our own lock');
    lock.release();
    assert.equal(fs.existsSync(file), false);
    const holder = (pid) => JSON.stringify({ pid, host: os.hostname(), since: new Date().toISOString() });
    fs.writeFileSync(file, holder(process.ppid)); // a live process: the one that ran this test
    assert.equal(heldByAnother(file), true, 'a live holder');
    assert.equal(tryLock(file), undefined);
    fs.writeFileSync(file, holder(2 ** 22 + 1)); // above Linux's pid_max: no such process
    assert.equal(heldByAnother(file), false, 'a dead holder');
    const taken = tryLock(file);
    assert.ok(taken, 'a dead holder is taken over');
    taken.release();
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

let failed = 0;
for (const { name, fn } of checks) {
  try {
    await fn();
    console.log(`[vscode logic] ok: ${name}`);
  } catch (e) {
    failed++;
    console.log(`[vscode logic] FAIL: ${name}: ${e?.stack ?? e}`);
  }
}
console.log(`[vscode logic] ${checks.length - failed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
