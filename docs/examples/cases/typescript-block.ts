interface Task {
  id: number;
  title: string;
  done: boolean;
}

export class TodoList {
  private tasks: Task[] = [];
  private nextId = 1;

  add(title: string): Task {
    ‸
  }

  complete(id: number): void {
    const task = this.tasks.find((t) => t.id === id);
    if (task) task.done = true;
  }
}
