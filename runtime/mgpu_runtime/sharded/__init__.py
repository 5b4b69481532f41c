"""Global values held in row pieces: what the training loop sees, outside the model's ``forward``.

**The contract, for both targets.** The reference is the original script under ``nn.DataParallel`` on W
devices. DataParallel scatters each batch in ``torch.chunk`` spans and runs ``forward`` on each device;
everything outside ``forward`` runs once, in one process, on the gathered values. So here:

* inside the wrapped module's ``forward``, each rank (``--to ddp``) or replica (``--to balanced``) runs what
  its device ran: its chunk, its BatchNorm statistics, its dropout draws, its own loss;
* outside it, every value the loop sees is what DataParallel gave it: the global batch, the gathered
  outputs, and everything computed from them (losses, normalisers, masks, counts, metrics, ``.item()``,
  Python ``if``s, numpy).

A ``Sharded`` tensor is such a global value, held lazily: each rank (or replica) keeps only its rows (its
*piece*) along dimension 0, and the layout says how many rows every part holds. It is a real
``torch.Tensor`` subclass whose ``shape``, ``size()``, ``numel()`` and ``len()`` are the global value's.
Every torch operation on it follows one rule of ``rules.py``:

* element-wise and row-wise operations (a ``dim`` other than 0, ``view(-1, C)``, ``F.linear``, indexing
  other dimensions, a mask of the same rows) run on each piece and give a ``Sharded`` again;
* reductions over the rows (``sum``, ``mean``, ``any`` ...) and torch's loss functions are collectives: local
  numerators over global denominators (``loss_rules.py``), the same value on every rank;
* anything else (indexing across rows, ``sort``/``topk``/``cdist`` over the batch, ``.numpy()``, iteration,
  an op with no rule) *materialises* the global value, differentiably, and computes it the same on every
  rank. An unknown operation is therefore exact, only slower, never wrong.

Only the collectives differ between the two targets (``groups.py``): the distributed runtime reduces over
processes, the balanced runtime over the replicas' devices in one process.

**Gradients** (distributed): each rank's gradient of a value that every rank holds alike (a parameter, the
loss) is its *part*: the parts sum, over the ranks, to the gradient of the one global loss. A backward from
such a value starts at ``1/W`` on every rank (``gradients.py``), a collective's backward sums the parts
(``groups.py``), and the gradients of parameters are summed across ranks: DDP's reduction for the wrapped
model, and at each optimizer step for any other parameter. A piece's own gradient is whole on its rank. A
gradient hook on a global value is given its whole gradient (``hooks.py``).
"""

from mgpu_runtime.sharded.groups import Group, RankGroup, ReplicaGroup
from mgpu_runtime.sharded.tensor import Sharded, materialize

__all__ = ["Group", "RankGroup", "ReplicaGroup", "Sharded", "materialize"]
