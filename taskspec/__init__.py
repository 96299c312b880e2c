"""What the server, the `kernelbot` CLI and the harness's job builder share about a task, with no Django: the
formats (`model`), reading them (`loader`), the score rule (`scoring`) and the public job spec (`jobspec`)."""
