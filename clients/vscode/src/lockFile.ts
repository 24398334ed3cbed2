// A lock between VS Code windows (each has its own extension host process): a file created only if
// it does not exist, holding its holder's pid, host and start time. The holder touches it every
// HEARTBEAT_MS; a waiter takes it over once the holder's process is gone (same host) or the file has
// not been touched for STALE_MS (a hung window, another host, a pid reused since), so a window that
// crashed or was killed mid-setup blocks no one for long. Plain Node, no VS Code API.
import * as fs from 'fs';
import * as os from 'os';
import * as path from 'path';

const HEARTBEAT_MS = 30_000;
const STALE_MS = 4 * HEARTBEAT_MS;
// A holder writes its file right after creating it: one still empty or unreadable after this died
// between the two.
const UNREADABLE_STALE_MS = 10_000;
const POLL_MS = 1000;

export interface Lock {
  release(): void;
}

interface Holder {
  pid: number;
  host: string;
  since: string;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0); // signal 0 only tests that the process exists
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM'; // exists, another user's
  }
}

function stale(text: string, touchedMs: number): boolean {
  const age = Date.now() - touchedMs;
  if (age > STALE_MS) return true;
  let holder: Holder;
  try {
    holder = JSON.parse(text);
  } catch {
    return age > UNREADABLE_STALE_MS;
  }
  return holder.host === os.hostname() && !alive(holder.pid);
}

// Removes a stale lock whose text was `seen`. It goes aside first (a rename is atomic): if another
// waiter broke it and took the lock between our read and our rename, what went aside is that
// waiter's fresh lock, and it goes back.
function breakStale(file: string, seen: string): void {
  const aside = `${file}.${process.pid}.stale`;
  try {
    fs.renameSync(file, aside);
  } catch {
    return; // gone already: another waiter broke it
  }
  if (fs.readFileSync(aside, 'utf8') !== seen) fs.renameSync(aside, file);
  else fs.rmSync(aside, { force: true });
}

// The lock if it is free or stale; undefined while a live holder has it.
export function tryLock(file: string): Lock | undefined {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const text = JSON.stringify({ pid: process.pid, host: os.hostname(), since: new Date().toISOString() } satisfies Holder);
  for (;;) {
    try {
      fs.writeFileSync(file, text, { flag: 'wx' });
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
    let seen: string;
    let touchedMs: number;
    try {
      seen = fs.readFileSync(file, 'utf8');
      touchedMs = fs.statSync(file).mtimeMs;
    } catch {
      continue; // released between our create and our read
    }
    if (!stale(seen, touchedMs)) return undefined;
    breakStale(file, seen);
  }
  const heartbeat = setInterval(() => {
    const now = new Date();
    try {
      fs.utimesSync(file, now, now);
    } catch {
      // gone (a user removed it): the next waiter takes the lock, nothing to keep alive
    }
  }, HEARTBEAT_MS);
  heartbeat.unref();
  return {
    release() {
      clearInterval(heartbeat);
      try {
        // Only our own: a waiter that judged us stale may hold it now.
        if (fs.readFileSync(file, 'utf8') === text) fs.rmSync(file);
      } catch {
        // gone already
      }
    },
  };
}

// Whether another process holds the lock now and is not stale (the lock is not taken).
export function heldByAnother(file: string): boolean {
  try {
    const text = fs.readFileSync(file, 'utf8');
    if (stale(text, fs.statSync(file).mtimeMs)) return false;
    const holder: Holder = JSON.parse(text);
    return holder.pid !== process.pid || holder.host !== os.hostname();
  } catch {
    return false; // no lock, or one being written: nothing to wait for yet
  }
}

// The lock, once its holder releases it or goes stale; undefined if `cancelled()` turns true first.
export async function waitForLock(file: string, cancelled: () => boolean): Promise<Lock | undefined> {
  for (;;) {
    const lock = tryLock(file);
    if (lock) return lock;
    if (cancelled()) return undefined;
    await new Promise((resolve) => setTimeout(resolve, POLL_MS));
  }
}
