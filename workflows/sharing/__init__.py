"""The parts of `GpuSharing` (workflows/gpu_sharing.py), each one idea of its runbook.
Each takes the run (`SharingRun`: its cluster, policy, carried state and step
kernel) explicitly and never calls back into the workflow.

- `run.py`: what every part is given, and the move's call, ids and counts.
- `notices.py`: what the sharing workflow tells people: a move's messages, a borrow's in its
  incident's thread.
- `evaluation.py`: one evaluation's figures and verdict (`core.sharing.decide`).
- `move_steps.py`: one step of a move on the step kernel, recorded on the move.
- `moves.py`: one move from end to end: approval, lend or return, where the node is after.
- `approval.py`: a move that waits for a human, and the decisions that answer it.
- `lending.py`: a node lent to inference.
- `returning.py`: a node returned to training, through the health gate.
- `borrowing.py`: an inference node borrowed by training while a node is repaired.
- `yielding.py`: a node a remediation incident takes.
- `manual.py`: what people ask of it: their own move, a failed node cleared.
"""
