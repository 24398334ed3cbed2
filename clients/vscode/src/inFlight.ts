// The requests in flight to the server, as the middleware counts them, and a wait for a pause between
// them. A restart stops the server, and a request it holds then gets no answer: the ghost text the user
// is waiting for would not come. So a restart that can wait (onto an updated environment) waits until
// nothing is in flight and nothing has been asked for a moment, the pause between two bursts of typing.
// Plain Node, no VS Code API: clients/tests/vscode_logic_test.mjs runs it with a clock of its own.

export interface Clock {
  now(): number; // ms
  sleep(ms: number): Promise<void>;
}

const realClock: Clock = {
  now: () => Date.now(),
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
};

export class InFlight {
  private count = 0;
  private lastChange: number; // when a request last started or ended
  private readonly clock: Clock;

  constructor(clock: Clock = realClock) {
    this.clock = clock;
    this.lastChange = clock.now();
  }

  started(): void {
    this.count++;
    this.lastChange = this.clock.now();
  }

  ended(): void {
    this.count = Math.max(0, this.count - 1);
    this.lastChange = this.clock.now();
  }

  pending(): number {
    return this.count;
  }

  // Resolves true once no request is in flight and none has started or ended for `quietMs`; false
  // if `cancelled()` turns true first.
  async quiet(quietMs: number, cancelled: () => boolean = () => false): Promise<boolean> {
    for (;;) {
      if (cancelled()) return false;
      const idleMs = this.clock.now() - this.lastChange;
      if (this.count === 0 && idleMs >= quietMs) return true;
      // With a request in flight, look again after a pause's length; else when this pause would be one.
      await this.clock.sleep(this.count > 0 ? quietMs : quietMs - idleMs);
    }
  }
}
