"""A step's whole lifecycle, in one place, as functions over the ledger's `Site` (its
`Core` — log, storage, clock, options, guard — its workspaces' places and their leases),
handed down by the facades (`Ledger`, ``ledger.workspaces``) and never the `Ledger`:

- `values` — what a planner hands in and what the ledger answers (`Write`, `StepPlan`,
  `Receipt`, `ApplyResult`, `Compensation`, …);
- `attempt` — one reader of an attempt's events (`Attempt`, ``Ledger.attempt()``);
- `admit` — the plan, recorded with its post-images before anything is applied;
- `apply`, `fence`, `draft` — the fenced apply: checks and exchanges with no lock held,
  recorded by one transaction that checks again;
- `undo` — compensation and settling;
- `tidy` — what a step leaves beside its paths, collected once nobody can own it;
- `artifacts` — the artifact protocol: plan, pin, store, publish, ack, the one-commit
  fast paths;
- `run` — the runners: `run_step` (artifacts only) and `run_fenced_step` (read, plan,
  admit, apply, commit; resumed after a crash).

Nothing here imports a front end (cli, mcp, ui, langgraph, demo) or `ledger.ledger`.
"""
