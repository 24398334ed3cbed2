// The status bar item: server state (loading / ready / error); what the user waits for ghost text,
// measured here (keystroke or cursor move to the inline-completion provider's non-empty answer, p50 of
// the last 100); a spinner while a request is in flight; the load's percentage from its work-done
// progress; and what the user set: off (globally or for the active editor's language), snoozed (with
// the minutes left), manual trigger, or the editor's own inline suggestions turned off. Clicking opens
// the menu. Also the words for the server's reasons for an empty answer, shown after a manual trigger.
import { performance } from 'perf_hooks';
import * as vscode from 'vscode';

export interface SpecdecStatus {
  state: 'loading' | 'ready' | 'error';
  message: string;
  acceptance: number | null;
  p50_ms: number | null; // the server's: request received to answer sent, empty answers included
  optimizing?: boolean; // the server is compiling its CPU step in the background; it answers meanwhile
}

// The server's `specdec/completed` notification (server/lsp.py).
export interface Completed {
  uri: string;
  requestId: string;
  outcome: string;
  latencyMs: number;
  reason: string | null; // null when shown
}

// What the extension decides, beside the server's state.
export interface Gate {
  enabled: boolean; // completions on for the active editor's language (or globally, with no editor)
  offReason: string; // "off" or "off for markdown"
  snoozedMs: number; // time left, 0 when not snoozed
  manual: boolean;
  inlineSuggestOff: string; // "" or where the editor's own ghost text is off: "in the editor", "for python"
}

const ICONS: Record<SpecdecStatus['state'], string> = {
  loading: '$(loading~spin)',
  ready: '$(check)',
  error: '$(error)',
};

const SAMPLES = 100;
// VS Code's suggest widget, when it opens first, keeps the ghost text from showing: an answer that
// takes longer than this often loses that race.
export const SLOW_MS = 750;
// The spinner shows once a request has been in flight this long, and stays until nothing has been
// in flight for HIDE_AFTER_MS: quick answers and the gaps between keystrokes do not make it flicker.
const SHOW_AFTER_MS = 300;
const HIDE_AFTER_MS = 250;

export class StatusBar implements vscode.Disposable {
  private readonly item = vscode.window.createStatusBarItem('specdec.status', vscode.StatusBarAlignment.Right, 100);
  private status: SpecdecStatus = { state: 'loading', message: '', acceptance: null, p50_ms: null };
  private percentage: number | undefined; // of the model load, while the server reports one
  // While loading with no percentage (the server's imports, a load that reports none), the seconds since it
  // began, counted each second: the item never stands still through a first start.
  private loadingSince = Date.now();
  private loadingTimer: NodeJS.Timeout | undefined;
  private disposed = false;
  private progressMessage = '';
  private readonly waits: number[] = []; // ms, keystroke to a non-empty answer, the last SAMPLES
  private inFlight = 0;
  private fetching = false;
  private spinnerTimer: NodeJS.Timeout | undefined;
  private message: vscode.Disposable | undefined; // the brief status-bar message of an empty manual answer

  constructor(private gate: Gate) {
    this.item.name = 'specdec';
    this.item.command = 'specdec.showMenu';
    this.render();
    this.item.show();
  }

  update(status: SpecdecStatus): void {
    if (status.state === 'loading' && this.status.state !== 'loading') this.loadingSince = Date.now();
    this.status = status;
    if (status.state !== 'loading') this.percentage = undefined;
    this.render();
  }

  // The load's work-done progress: a percentage (or undefined) and its message; `end` clears it.
  progress(percentage: number | undefined, message: string | undefined, end = false): void {
    this.percentage = end ? undefined : percentage ?? this.percentage;
    this.progressMessage = end ? '' : message ?? this.progressMessage;
    this.render();
  }

  setGate(gate: Gate): void {
    this.gate = gate;
    this.render();
  }

  // A non-empty answer reached the editor `ms` after the keystroke that asked for it.
  answered(ms: number): void {
    this.waits.push(ms);
    if (this.waits.length > SAMPLES) this.waits.shift();
    this.render();
  }

  requestStarted(): void {
    this.inFlight++;
    this.armSpinner();
  }

  requestEnded(): void {
    this.inFlight = Math.max(0, this.inFlight - 1);
    this.armSpinner();
  }

  // "specdec: nothing to offer (end of a finished line)", for a few seconds.
  showNothingToOffer(why: string): void {
    this.message?.dispose();
    this.message = vscode.window.setStatusBarMessage(`specdec: nothing to offer (${why})`, 5000);
  }

  serverState(): SpecdecStatus['state'] {
    return this.status.state;
  }

  // The median wait in ms, or null before the first answer.
  p50(): number | null {
    if (this.waits.length === 0) return null;
    const sorted = [...this.waits].sort((a, b) => a - b);
    const middle = sorted.length >> 1;
    return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
  }

  // One line: "ready · 412 ms keystroke to ghost text (p50 of the last 37; the last 380 ms) · ..." (the
  // tooltip and the menu title).
  describe(): string {
    const parts: string[] = [this.status.state];
    if (this.status.state === 'loading' && this.percentage !== undefined) parts[0] += ` ${Math.round(this.percentage)}%`;
    if (this.status.state === 'ready' && this.status.optimizing) parts[0] += ', optimizing';
    if (this.gate.inlineSuggestOff) {
      parts.push(`ghost text is off ${this.gate.inlineSuggestOff} (editor.inlineSuggest.enabled): no completion will show`);
    }
    if (!this.gate.enabled) parts.push(`completions ${this.gate.offReason}`);
    if (this.gate.snoozedMs > 0) parts.push(`snoozed, ${minutesLeft(this.gate.snoozedMs)} left`);
    if (this.gate.manual) parts.push('manual trigger (Alt+\\)');
    if (this.fetching) parts.push('fetching a completion');
    const p50 = this.p50();
    const last = this.waits[this.waits.length - 1];
    if (p50 !== null) {
      parts.push(
        `${Math.round(p50)} ms keystroke to ghost text (p50 of the last ${this.waits.length}; ` +
          `the last ${Math.round(last)} ms)`,
      );
    }
    if (last !== undefined && last > SLOW_MS) {
      parts.push(`slow: after ${SLOW_MS} ms VS Code may open its suggest widget instead of the ghost text`);
    }
    if (this.status.p50_ms !== null && this.status.p50_ms !== undefined) {
      parts.push(`server p50 ${Math.round(this.status.p50_ms)} ms (request in to answer out, empty answers included)`);
    }
    if (this.status.acceptance !== null && this.status.acceptance !== undefined) {
      parts.push(`${Math.round(this.status.acceptance * 100)}% accepted`);
    }
    const message = this.progressMessage || this.status.message;
    if (message) parts.push(message);
    return parts.join(' · ');
  }

  // Ready: "$(check) specdec 412 ms", "$(check) specdec (manual) 412 ms", "... 1240 ms (slow)" while the
  // last answer took over SLOW_MS; the spinner replaces the check while a request is in flight.
  private render(): void {
    let text: string;
    if (this.status.state === 'loading') {
      text = this.loadingText();
    } else if (this.status.state === 'error') {
      text = `${ICONS.error} specdec`;
    } else if (!this.gate.enabled) {
      text = '$(circle-slash) specdec';
    } else if (this.gate.snoozedMs > 0) {
      text = `$(clock) specdec snoozed ${minutesLeft(this.gate.snoozedMs)}`;
    } else if (this.gate.inlineSuggestOff) {
      text = '$(warning) specdec';
    } else {
      const p50 = this.p50();
      const last = this.waits[this.waits.length - 1];
      const icon = this.fetching ? '$(sync~spin)' : ICONS.ready;
      text = `${icon} specdec${this.gate.manual ? ' (manual)' : ''}`;
      if (this.status.optimizing) text += ' optimizing';
      if (p50 !== null) text += ` ${Math.round(p50)} ms`;
      if (last !== undefined && last > SLOW_MS) text += ' (slow)';
    }
    this.item.text = text;
    this.tickWhileLoading();
    this.item.tooltip = `specdec: ${this.describe()}`;
    this.item.backgroundColor =
      this.status.state === 'error'
        ? new vscode.ThemeColor('statusBarItem.errorBackground')
        : this.gate.inlineSuggestOff
          ? new vscode.ThemeColor('statusBarItem.warningBackground')
          : undefined;
  }

  private armSpinner(): void {
    if (this.spinnerTimer) clearTimeout(this.spinnerTimer);
    this.spinnerTimer = undefined;
    const want = this.inFlight > 0;
    if (want === this.fetching) return;
    this.spinnerTimer = setTimeout(
      () => {
        this.spinnerTimer = undefined;
        this.fetching = this.inFlight > 0;
        this.render();
      },
      want ? SHOW_AFTER_MS : HIDE_AFTER_MS,
    );
  }

  private loadingText(): string {
    const done =
      this.percentage !== undefined
        ? `${Math.round(this.percentage)}%`
        : `${Math.round((Date.now() - this.loadingSince) / 1000)} s`;
    return `${ICONS.loading} specdec loading ${done}`;
  }

  // Each second only the text: the tooltip and colour stay as they are, so an open hover does not flicker.
  private tickWhileLoading(): void {
    const loading = this.status.state === 'loading' && !this.disposed;
    if (loading && !this.loadingTimer) {
      this.loadingTimer = setInterval(() => {
        this.item.text = this.loadingText();
      }, 1000);
    }
    if (!loading && this.loadingTimer) {
      clearInterval(this.loadingTimer);
      this.loadingTimer = undefined;
    }
  }

  dispose(): void {
    this.disposed = true;
    if (this.loadingTimer) clearInterval(this.loadingTimer);
    if (this.spinnerTimer) clearTimeout(this.spinnerTimer);
    this.message?.dispose();
    this.item.dispose();
  }
}

// Where the user's wait for ghost text begins: the document's last change or cursor move (VS Code
// sends both to the extension host before the request they bring, which follows its debounce). A
// position already answered at the document's version is no new wait: VS Code asks there again (as
// its suggest widget opens or closes) while the ghost text is up, and the server answers at once
// from what it showed.
export class WaitClock implements vscode.Disposable {
  private readonly documents = new Map<string, { version: number; at: number; answered: Set<string> }>();
  private readonly subscriptions = [
    vscode.workspace.onDidChangeTextDocument((e) => {
      if (e.contentChanges.length > 0) this.touch(e.document); // none: dirty state only, same version
    }),
    vscode.window.onDidChangeTextEditorSelection((e) => this.touch(e.textEditor.document)),
    vscode.workspace.onDidCloseTextDocument((document) => this.documents.delete(document.uri.toString())),
  ];

  // When the wait for an answer at this position began (`asked`, the request's own time, if nothing
  // was seen), or undefined if the position was answered already at this version.
  waitStart(document: vscode.TextDocument, position: vscode.Position, asked: number): number | undefined {
    const entry = this.documents.get(document.uri.toString());
    if (!entry || entry.version !== document.version) return asked;
    return entry.answered.has(positionKey(position)) ? undefined : entry.at;
  }

  answered(document: vscode.TextDocument, position: vscode.Position): void {
    const entry = this.documents.get(document.uri.toString());
    (entry && entry.version === document.version ? entry : this.touch(document)).answered.add(positionKey(position));
  }

  private touch(document: vscode.TextDocument): { version: number; at: number; answered: Set<string> } {
    const key = document.uri.toString();
    const old = this.documents.get(key);
    const answered = old && old.version === document.version ? old.answered : new Set<string>();
    const entry = { version: document.version, at: performance.now(), answered };
    this.documents.set(key, entry);
    return entry;
  }

  dispose(): void {
    for (const s of this.subscriptions) s.dispose();
  }
}

function positionKey(position: vscode.Position): string {
  return `${position.line}:${position.character}`;
}

// The latest `specdec/completed` per document. The server sends it before the answer of each request
// that reached its pipeline, so an empty answer's reason is the note for its document received after
// the request went out (the two lanes at one position share a decode, and so its reason).
export class CompletedNotes {
  private readonly latest = new Map<string, { note: Completed; at: number }>();

  record(note: Completed): void {
    this.latest.set(note.uri, { note, at: performance.now() });
  }

  since(uri: string, sent: number): Completed | undefined {
    const entry = this.latest.get(uri);
    return entry && entry.at >= sent ? entry.note : undefined;
  }
}

// What a filter's emptying a completion means (server/filters/*.py), by module name.
const FILTER_WORDS: Record<string, string> = {
  brackets: 'it would have unbalanced the brackets',
  rest_of_line: 'it only repeated the rest of the line',
  suffix_repeat: 'it only repeated the next line',
  self_repeat: 'it only repeated itself',
  phrase_repeat: 'it only repeated itself',
  control_chars: 'it began with a control character',
  trailing_blank: 'it was only whitespace',
  decode_stops: 'it ended at once at a stop string',
};

const REASON_WORDS: Record<string, string> = {
  gate: 'the model was not confident enough (specdec.minConfidence)',
  'finished-line': 'end of a finished line',
  scope: 'the enclosing block ends here',
  'no-text': 'the model wrote nothing',
  cancelled: 'cancelled by a newer request',
  stale: 'the document changed meanwhile',
  'language-off': 'the server has this language off (specdec.enabledLanguages)',
  'too-large': 'the file is larger than specdec.maxDocumentChars',
  binary: 'the file looks binary',
  error: 'an error; the specdec log says which',
};

// Human words for a `specdec/completed` reason code.
export function reasonWords(reason: string | null): string {
  if (reason === null) return 'no reason given';
  if (reason.startsWith('filter:')) {
    const name = reason.slice('filter:'.length);
    return FILTER_WORDS[name] ?? `the ${name} filter cut all of it`;
  }
  return REASON_WORDS[reason] ?? reason;
}

function minutesLeft(ms: number): string {
  const minutes = Math.ceil(ms / 60_000);
  return `${minutes} min`;
}
