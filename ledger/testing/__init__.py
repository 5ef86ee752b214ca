"""steptrail's test machinery, shipped so that it runs on a user's own machine.

- `faults`: power loss, I/O errors and disk full under a ledger (one simulated disk
  under the SQLite files and the blob store), the crash and fault sweeps behind
  ``steptrail chaos --power-loss`` / ``--io-errors`` and the test suite's fault tests;
  the SQLite half of it (the fault VFS) is the SQLite store's,
  `ledger.store.sqlite.faultvfs`.
- `chaos`: ``steptrail chaos``, a real process SIGKILLed at every operation of a step.
- `fuzz`: ``steptrail fuzz``, the interleaving search over the fence protocol, its
  checkers and its shrinker.
- `commands`: the ``chaos`` and ``fuzz`` commands, entry points of the group
  ``steptrail.commands`` (pyproject.toml) that ``steptrail`` loads when one is invoked
  or listed.
- `person`: the person injector (issue 36): a person with an editor and a shell — a
  save by rename, a write in place, a second quick save, a delete, a create, a chmod, a
  rename of the parent directory, a symlink or a directory swapped in, a hard link —
  acting at every ``ws-`` point of a multi-path step's apply, refusal, undo, crash,
  settling and resumption, in both exchange modes, and the checker that says whether
  anything the person did was lost or the ledger's account disagrees with the disk
  (``python -m ledger.testing.person`` prints the table).
- `broken`: the negative controls (an append without the ledger's guard, a step that
  publishes its manifest before its blobs).
- `pgserver`: a throwaway PostgreSQL server from the machine's binaries (a temporary data
  directory, a private socket; as root, run as the ``postgres`` user), for the tests, the
  benchmarks and ``python -m ledger.testing.pgserver start DIR`` (the README's demo).

The runtime never imports this package, not even lazily: the library works without it,
and its commands reach the command line as entry points (tests/architecture/test_architecture.py
checks it).
"""
