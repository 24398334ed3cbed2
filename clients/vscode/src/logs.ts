// The two output channels: "specdec" (the extension's messages and the server's stderr, each line at
// the level the server logged it) and "specdec LSP trace" (the LSP messages, per `specdec.trace.server`).
import * as readline from 'readline';
import type { Readable } from 'stream';
import * as vscode from 'vscode';

export type Trace = 'off' | 'messages' | 'verbose';

export function traceSetting(): Trace {
  const value = vscode.workspace.getConfiguration('specdec').get<string>('trace.server', 'off');
  return value === 'messages' || value === 'verbose' ? value : 'off';
}

// The server's stderr into the "specdec" channel. The server logs as `LEVEL logger: message`
// (speccomplete/cli.py); a line without a level (a traceback, a library's warning, a progress bar)
// keeps the level of the line before it. (vscode-languageclient hands a server's stdout here too, but
// only for transports other than stdio; ours is stdio.)
export function pipeStderr(input: Readable, output: vscode.LogOutputChannel): void {
  let level: 'debug' | 'info' | 'warn' | 'error' = 'warn';
  readline.createInterface({ input, crlfDelay: Infinity, terminal: false, historySize: 0 }).on('line', (line) => {
    const match = /^(DEBUG|INFO|WARNING|ERROR|CRITICAL) /.exec(line);
    if (match) {
      level = ({ DEBUG: 'debug', INFO: 'info', WARNING: 'warn', ERROR: 'error', CRITICAL: 'error' } as const)[
        match[1] as 'DEBUG' | 'INFO' | 'WARNING' | 'ERROR' | 'CRITICAL'
      ];
    } else if (line.startsWith('specdec: error:')) {
      level = 'error';
    }
    output[level](`[server] ${line}`);
  });
}

// vscode-languageclient 11 traces only while its trace channel's log level is Trace, and then reads
// `<client id>.trace.server` for messages vs verbose. So that `specdec.trace.server` alone turns the
// trace on and off, the trace channel is this wrapper around a plain output channel: its log level is
// Trace exactly when the setting is not "off", and it tells the client when that changes.
export class TraceChannel implements vscode.LogOutputChannel {
  private readonly channel = vscode.window.createOutputChannel('specdec LSP trace');
  private readonly levelChanged = new vscode.EventEmitter<vscode.LogLevel>();
  private readonly listener: vscode.Disposable;
  readonly onDidChangeLogLevel = this.levelChanged.event;
  readonly name = this.channel.name;

  constructor() {
    this.listener = vscode.workspace.onDidChangeConfiguration((e) => {
      if (e.affectsConfiguration('specdec.trace.server')) this.levelChanged.fire(this.logLevel);
    });
  }

  get logLevel(): vscode.LogLevel {
    return traceSetting() === 'off' ? vscode.LogLevel.Off : vscode.LogLevel.Trace;
  }

  private write(level: string, message: string): void {
    this.channel.appendLine(`${new Date().toISOString()} [${level}] ${message}`);
  }

  trace(message: string): void {
    if (traceSetting() !== 'off') this.write('trace', message);
  }
  debug(message: string): void {
    this.write('debug', message);
  }
  info(message: string): void {
    this.write('info', message);
  }
  warn(message: string): void {
    this.write('warning', message);
  }
  error(error: string | Error): void {
    this.write('error', String(error));
  }
  append(value: string): void {
    this.channel.append(value);
  }
  appendLine(value: string): void {
    this.channel.appendLine(value);
  }
  replace(value: string): void {
    this.channel.replace(value);
  }
  clear(): void {
    this.channel.clear();
  }
  show(preserveFocus?: boolean): void;
  show(column?: vscode.ViewColumn, preserveFocus?: boolean): void;
  show(a?: boolean | vscode.ViewColumn, b?: boolean): void {
    this.channel.show(typeof a === 'boolean' ? a : b);
  }
  hide(): void {
    this.channel.hide();
  }
  dispose(): void {
    this.listener.dispose();
    this.levelChanged.dispose();
    this.channel.dispose();
  }
}
