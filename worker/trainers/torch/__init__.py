"""The torch trainer: `python -m worker.trainers.torch` (worker/trainers/session.py's loop around
session.py's Session: train.py's, in this process or in each of distributed.py's ranks) trains the
model of model.py.

PRELOAD is what this trainer's fork server imports once before forking children (the child imports
them lazily, so a skip stays fast). torch._dynamo: the optimizers import it on construction (about
2 s here); torch.utils.serialization: torch.save imports it (tens of ms a job). Importing this
package itself imports nothing heavy, nor do session.py and train.py (not preloaded: the child's
setup_s clock starts before them, at __main__). prepare_server() runs in the fork server once, after
PRELOAD, before the first child.
"""

PRELOAD = ("numpy", "torch", "torch.nn.attention", "torch.optim", "torch._dynamo", "torch.utils.serialization",
           "tokenizers", "worker.data", "worker.trainers.harness", "worker.trainers.session", "worker.trainers.params",
           "worker.trainers.torch.model", "worker.trainers.torch.readback")


def prepare_server() -> None:
    """Read the ISA MKL and oneDNN dispatch to once for every child of this server (MKL's verbose
    banner costs up to a second a job): worker/knobs/isa_check.py hold_library_isas()."""
    from worker.knobs import isa_check

    isa_check.hold_library_isas()
