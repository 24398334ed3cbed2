// How a server was found: the record that locate.ts and setup.ts hand to the rest of the extension,
// and the names of the places that the extension treats specially. It imports no other module of
// the extension, so locate.ts and setup.ts depend on it and not on each other.

export interface Server {
  command: string;
  args: string[]; // before the subcommand: ['-m', 'speccomplete'] for an interpreter
  source: string; // where it was found, for the log and the status bar tooltip
}

// Sources that extension.ts acts on: the managed server's files are stopped before a repair replaces
// them, and a new interpreter in the Python extension restarts a server found through it.
export const MANAGED = 'the managed environment';
export const PYTHON_EXTENSION = "the Python extension's interpreter";
