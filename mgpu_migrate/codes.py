"""The registry of diagnostic codes: what each means, which rule owns it, and its ``--explain`` page.

Codes are stable (users silence them with ``# noqa: CODE``, scripts grep for them):

* ``MGP0xx`` (kind ``error``): the file itself could not be processed; it is left byte-identical.
* ``MGP1xx`` (kind ``rewrite``): a rewrite the tool made. Its page is the owning rule's doc (What it does /
  Why is this bad? / Example / Use instead / Fix safety).
* ``MGP2xx`` and ``MGP3xx`` (kind ``review``): a site left as it was, for a person to look at. Its page says what the tool
  found, why it left the site, and what to do.

A rule declares its codes in one place: ``CODE`` (its rewrite, or its main review code) and ``REVIEW_CODES``
(each review code with its one-line summary). This module adds what a message leaves out: the page of every
review code (``_REVIEW_PAGES``) and of the file codes. Importing it imports the rules (and libcst): only
``--explain`` and ``--list-codes`` need it.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass

from mgpu_migrate.diagnostics import FILE_CHANGED, INTERNAL_ERROR, OUTSIDE_TREE, PARSE_ERROR, READ_ERROR, TOO_LARGE

ERROR, REWRITE, REVIEW = "error", "rewrite", "review"


@dataclass(frozen=True)
class CodeInfo:
    code: str
    name: str
    kind: str  # "error" | "rewrite" | "review"
    summary: str  # one line
    page: str  # the --explain markdown page
    rule: str | None  # owning rule class name


# The files the tool could not process: (name, summary, what happened, what to do).
_ERROR_PAGES = {
    READ_ERROR: (
        "read-error",
        "the file could not be read",
        "The path does not exist, cannot be opened, or its bytes do not decode in the encoding the file declares "
        "(a PEP 263 coding line, a BOM, else UTF-8).",
        "Check the path and the file's encoding. The other files of the run are still processed; the exit "
        "status is 2.",
    ),
    PARSE_ERROR: (
        "parse-error",
        "the file could not be parsed, or not rewritten without losing text",
        "The file is not valid Python for both CPython and LibCST (a syntax error, code nested too deeply), or "
        "LibCST would drop comments or blank lines after the last statement (they follow a whitespace-only "
        "line), so writing its output would lose them. The file is left byte-identical.",
        "Fix the syntax error the message points at; for lost trailing lines, remove the whitespace-only line "
        "near the end of the file. The exit status is 2.",
    ),
    INTERNAL_ERROR: (
        "internal-error",
        "the tool failed on this file; it is left unchanged",
        "A rule or the rewrite itself failed (an exception, or a rewrite that did not compile). The tool never "
        "writes such a file, and goes on with the others.",
        "Please report it with the file (or a reduction of it). Until then, migrate the file by hand or silence "
        "the site with `# noqa`.",
    ),
    FILE_CHANGED: (
        "file-changed",
        "the file changed on disk while the tool ran; it was not written",
        "Between reading the file and replacing it, its size, modification time or content changed (an editor "
        "saved it, or another mgpu-migrate run wrote it). Writing the migration would have lost that edit, so "
        "the file keeps what is on disk now.",
        "Run the tool again on the file: it reads the new content. The exit status of this run is 2.",
    ),
    OUTSIDE_TREE: (
        "outside-tree",
        "a symlink in a walked directory leads out of it; skipped",
        "A directory walk found a symbolic link to a file outside the directory given on the command line. "
        "Rewriting it would change a file nobody named (as black, the tool skips such links).",
        "Name the link's target on the command line to migrate it, or leave it as it is.",
    ),
    TOO_LARGE: (
        "too-large",
        "the file is over the size limit; not parsed, left as it is",
        "A file that mentions DataParallel is larger than `max-file-size` (default 2MB). Generated files of that "
        "size take minutes and gigabytes to analyse, so the tool leaves them.",
        "Raise the limit for the run (`--max-file-size 20MB`, or `max-file-size` in `[tool.mgpu-migrate]`; 0 "
        "for no limit), or exclude the file.",
    ),
}

# Review codes: (name, why the site was left, what to do). The summary, "what it found", is the owning
# rule's REVIEW_CODES entry.
_REVIEW_PAGES = {
    "MGP201": (
        "dim-not-zero",
        "`DistributedDataParallel` splits the data by giving each process its own batches; it has no `dim` to "
        "scatter one batch along. A `dim != 0` wrap means the batch is not along the first dimension.",
        "Keep DataParallel for this model, or make the batch dimension the first one and drop `dim`. With one "
        "device per process `dim` does not matter to the model; what matters is that each process gets its rows "
        "of every batch, and `distribute_loader` cuts the first dimension. For a sequence-first model "
        "(`nn.GRU(...)` without `batch_first`, batches `(time, batch, ...)`) the exact manual migration is: let "
        "the loader yield batch-first tensors (drop the `collate_fn` that stacks along dim 1, or stack along "
        "dim 0), wrap it in `mgpu_runtime.distribute_loader(...)`, wrap the model in "
        "`mgpu_runtime.DistributedDataParallel(model)` without `dim`, and turn each batch sequence-first in the "
        "loop (`source, target = source.transpose(0, 1), target.transpose(0, 1)`). Each rank then holds the "
        "columns DataParallel's GPU of that index held, and the loss watch makes a token-mean loss over them "
        "exact. Splitting a whole batch by hand (`source.chunk(world_size(), dim=1)[rank()]`) is exact only "
        "when every rank gets the same number of rows and tokens: the runtime then knows no shares.",
    ),
    "MGP202": (
        "ambiguous-data-parallel-name",
        "The same name is bound to torch's DataParallel and to something else in this file (a second import, "
        "an assignment, a function of the same name), so the call may not be torch's.",
        "Bind the name once (`from torch.nn import DataParallel` and nothing else under that name).",
    ),
    "MGP203": (
        "criterion-used-otherwise",
        "The criterion is used other than by calling it (an attribute read, passed to code outside the file); "
        "a wrapped criterion would not offer what that use expects.",
        "Nothing, if the loss on the gathered output is fine (it is what DataParallel did). To compute it per "
        "device, wrap the criterion by hand in `mgpu_runtime.DataParallelCriterion`.",
    ),
    "MGP204": (
        "loss-not-splittable",
        "The runtime computes exactly only the losses whose reduction it knows (torch's losses with mean, sum "
        "or none, `ignore_index`, class weights). A custom loss, `CTCLoss` or a per-sample weight could give "
        "another value when computed per piece.",
        "Nothing: the loss is computed on the gathered output, as before. Wrap it by hand only if it is a mean "
        "or a sum over the rows of the batch.",
    ),
    "MGP205": (
        "loss-out-of-sight",
        "No loss on this model's outputs is computed in this file: the outputs, or the model, go to code the "
        "tool cannot see (a caller, another module), where the loss runs on the gathered output.",
        "Wrap that criterion in `mgpu_runtime.DataParallelCriterion` where it is built if it is a torch loss "
        "of rows (cross-entropy, MSE ...), or leave it: the loss is computed on the gathered output, as before. "
        "Leave a loss that compares the rows of a batch (a batch-hard triplet loss, a contrastive or "
        "Jensen-Shannon loss over the batch): computed per piece it would be another loss, with no error.",
    ),
    "MGP206": (
        "submodule-loss-gathered",
        "Only a sub-module is wrapped: its output is gathered where the rest of the model uses it, so the loss "
        "is computed on the output device, as before.",
        "Nothing. Wrap the whole model to compute the loss beside each piece of the output.",
    ),
    "MGP207": (
        "loss-on-transformed-output",
        "The loss gets a value computed from the outputs (`out.view(...)`, `log_softmax(out)`), so the outputs "
        "are gathered before it is computed.",
        "Move that computation into the model's `forward` so that the loss receives the outputs themselves.",
    ),
    "MGP208": (
        "encoding-pair-kept",
        "PyTorch-Encoding's model returns one output per device; code that uses them as a list (or a wrap with "
        "`dim != 0` under `--to ddp`) would not work with the runtime's model, whose output behaves like the "
        "gathered one.",
        "Use the outputs as one value (as after a gather), then run the tool again; or keep the pair.",
    ),
    "MGP209": (
        "functional-data-parallel-under-ddp",
        "The functional `data_parallel(module, input)` replicates the module on every call; under DDP the "
        "module is wrapped once and each process runs its own copy.",
        "Wrap the module once with `mgpu_runtime.DistributedDataParallel` and call the wrapper.",
    ),
    "MGP210": (
        "data-parallel-subclass-kept",
        "The subclass overrides part of DataParallel's machinery (`scatter`, `gather`, `replicate` ...) that the "
        "runtime's model does not use, or the target is `--to ddp`, where no subclass of DataParallel can be "
        "kept; rebased, it would lose what it overrides.",
        "Port what the override does by hand, or keep the subclass.",
    ),
    "MGP212": (
        "functional-loss-kept",
        "The functional loss gets a transformed input, or options its loss class cannot take, so it cannot be "
        "handed to the runtime's criterion; it is computed on the gathered output.",
        "Nothing, if the loss on the gathered output is fine. Otherwise compute the transformation in the "
        "model's `forward` and pass the outputs to the loss directly.",
    ),
    "MGP213": (
        "criterion-from-elsewhere",
        "A wrapped criterion can also come from code the tool cannot follow (a factory of another module, a "
        "parameter passed from outside the file), so that one is not wrapped.",
        "Wrap it where it is built, in `mgpu_runtime.DataParallelCriterion` (balanced) or "
        "`mgpu_runtime.DistributedCriterion` (ddp), if it is a loss of rows (a torch loss, a mean over the rows). "
        "Not a loss that compares the rows of a batch (a batch-hard triplet loss, a contrastive or Jensen-Shannon "
        "loss over the batch): on a piece of the batch it is another loss, with no error; under --to ddp such a "
        "loss leaves the file (MGP287 for a project's loss class).",
    ),
    "MGP214": (
        "starred-wrap-arguments",
        "Arguments passed with `*` or `**` may hold `device_ids`, `output_device` or `dim`, which mean nothing, "
        "or something else, under DistributedDataParallel.",
        "Pass the arguments by name, then run the tool again.",
    ),
    "MGP230": (
        "no-entry-point",
        "The file trains, but it has no `if __name__ == \"__main__\":` block or `main()` where "
        "`mgpu_runtime.setup()` could run first. The runtime's wrapper calls `setup()` when it is built, so "
        "the other processes start late (after any work done before the wrap).",
        "Call `mgpu_runtime.setup()` where your program starts.",
    ),
    "MGP231": (
        "existing-distributed-setup",
        "The file sets up distributed training itself (`init_process_group`, torch's or apex's DDP, "
        "`DistributedSampler`, `mp.spawn`). Only its DataParallel fallback is migrated; its data and "
        "checkpoints are left as they are. Started plainly on several GPUs, the fallback relaunches the script "
        "under torchrun.",
        "Check that the relaunched script takes its own distributed path (it reads `LOCAL_RANK` or `WORLD_SIZE` "
        "from the environment).",
    ),
    "MGP232": (
        "file-keeps-a-wrap",
        "`--to ddp` migrates a file entirely or not at all: a file that ran some wraps as one process per GPU "
        "and others as DataParallel, without the set-up and data of a distributed program, would work neither "
        "way. Another wrap in this file stays DataParallel (its own diagnostic says why).",
        "Migrate the wrap named in the message by hand first (or make it migratable), then run the tool again.",
    ),
    "MGP233": (
        "wrap-under-other-condition",
        "With several processes every process must wrap its model. The wrap runs only under a condition that "
        "is not a GPU guard, or in an `else`/`elif` branch, which the tool cannot extend safely.",
        "Make sure the condition holds on every process, e.g. `... or mgpu_runtime.world_size() > 1`.",
    ),
    "MGP234": (
        "evaluation-loader-whole",
        "An evaluation loader is left whole: every process evaluates all of it, so the metrics are the "
        "original's, without a speed-up.",
        "To split it, pass it through `mgpu_runtime.distribute_loader(...)` and reduce the metrics over the "
        "processes with `mgpu_runtime.reduce_sum`.",
    ),
    "MGP235": (
        "training-data-not-followed",
        "The tool cannot follow this training loop's data to a DataLoader, or cannot tell whether the loop "
        "trains, so the data is not split. Each process then trains on whole batches: the original's training "
        "only if every process draws the same ones (seeded alike, or not shuffled); the runtime stops the "
        "first step when they differ.",
        "Pass the loader through `mgpu_runtime.distribute_loader(...)` where it is built.",
    ),
    "MGP236": (
        "summed-loss",
        "The loss is summed by hand, which the runtime cannot weight by each process's share of the batch, so "
        "this loop's data is not split (each process trains on whole batches, as for MGP235).",
        "Use a mean, or a criterion wrapped in `mgpu_runtime.DistributedCriterion`, then distribute the loader.",
    ),
    "MGP237": (
        "custom-sampler",
        "`distribute_loader` runs a custom sampler on the main process only and splits each batch it makes.",
        "If the sampler already splits the data across processes (like `DistributedSampler`), drop that part.",
    ),
    "MGP238": (
        "iterable-dataset",
        "With an iterable dataset the main process reads every batch and sends each process its rows: correct, "
        "but the loading is not divided among the processes.",
        "Nothing, unless loading is the bottleneck: then shard the dataset by `mgpu_runtime.rank()` yourself.",
    ),
    "MGP320": (
        "trained-by-importer",
        "The wrap is in a function that returns the model (`load_model()`, `build_model()`) or in a class that "
        "keeps it (`self.model = nn.DataParallel(self.model)` in a wrapper module), and nothing in this file "
        "trains it: the modules that import this one do (the diagnostic names the first one found, preferring one "
        "that uses the function or class). Those modules hold the training loop, its loader and its loss, and "
        "they have no DataParallel of their own, so the tool does not rewrite them: migrating the wrap alone "
        "would give a program whose every process trains on whole batches.",
        "Migrate the module that trains: split its loader with `mgpu_runtime.distribute_loader`, make its loss "
        "exact, and wrap the model there (or migrate this wrap by hand together with it); or use "
        "`--to balanced`, which keeps one process.",
    ),
    "MGP240": (
        "save-on-every-process",
        "This save still runs on every process: it writes into a file object or a buffer, or it is "
        "`save_pretrained`, which `mgpu_runtime.save` does not replace.",
        "Put it under `if mgpu_runtime.is_main_process():`, or save to a path with `mgpu_runtime.save`.",
    ),
    "MGP241": (
        "progress-bar-on-every-process",
        "The progress bar passes a `disable` argument the tool cannot see into, so it is drawn by every process.",
        "Add `or not mgpu_runtime.is_main_process()` to its `disable` value.",
    ),
    "MGP243": (
        "wrapper-check-by-name",
        "The code checks the wrapper by its class name (`type(m).__name__ == 'DataParallel'`); the runtime's "
        "wrappers have other names.",
        "Use `isinstance(m, mgpu_runtime.PARALLEL_WRAPPERS)`.",
    ),
    "MGP244": (
        "explicit-other-gpu",
        "An explicit GPU other than the first: under DDP each process uses its own device, so a fixed GPU "
        "number puts every process on the same one.",
        "Use `mgpu_runtime.device()` (or `'cuda'` and `.cuda()` for the current one); choose the GPUs with "
        "`CUDA_VISIBLE_DEVICES` in the launch environment.",
    ),
    "MGP245": (
        "visible-devices-after-setup",
        "`CUDA_VISIBLE_DEVICES` chooses the GPUs only before the process binds to one. It is set after "
        "`mgpu_runtime.setup()`, or in a file that leaves `setup()` to the runtime, where a program whose entry "
        "point calls `setup()` has bound the process by then.",
        "Set it before the program starts, in the launch environment.",
    ),
    "MGP246": (
        "apex-numerics-dropped",
        "An apex argument that changes the numerics of the gradient reduction (`allreduce_always_fp32`, "
        "`gradient_predivide_factor` ...) was dropped: the runtime reduces gradients in their own precision, "
        "divided once.",
        "Check that the training still converges as before.",
    ),
    "MGP247": (
        "apex-unmappable",
        "The apex DistributedDataParallel has an argument with no equivalent in the runtime's wrapper "
        "(`gradient_average=False`, an argument the tool does not know), or no module argument.",
        "Migrate it by hand, or drop the argument if its default is fine.",
    ),
    "MGP248": (
        "batchnorm-per-process",
        "BatchNorm layers normalize over each process's slice of the batch, as they did over each GPU's under "
        "DataParallel: the same statistics as before, not the whole batch's.",
        "Nothing, to keep the original's behaviour; rerun with `--sync-bn` for statistics over the whole batch.",
    ),
    "MGP249": (
        "collective-in-main-process-block",
        "A collective, or a forward of the DDP model (which synchronizes), runs inside a block only the main "
        "process runs: the other processes never join it and the run hangs.",
        "Move it out of the block, or give that code the bare model (`model.module`).",
    ),
    "MGP250": (
        "partial-model-wrap",
        "Only part of a model is wrapped: DistributedDataParallel would average that part's gradients only, "
        "and each process would train its own copy of the rest. The wrap stays DataParallel, so the file is not "
        "made a distributed program.",
        "Wrap the whole model to migrate it.",
    ),
    "MGP251": (
        "ambiguous-apex-name",
        "The same name is bound to apex's DistributedDataParallel and to something else in this file, so the "
        "call may not be apex's.",
        "Bind the name once, then run the tool again.",
    ),
    "MGP252": (
        "wrap-of-non-model",
        "DataParallel wraps something that is not a model (an optimizer, a scheduler, a tensor, a literal): it "
        "parallelizes nothing, and the runtime's wrappers would fail on it. Its `.module` still gives the "
        "wrapped object, and it does not keep the file from being migrated.",
        "Drop the wrap (and the `.module` that unwraps it) when you next touch the code.",
    ),
    "MGP253": (
        "star-import-wrap",
        "A DataParallel-like name is bound nowhere in this file but may come from a `from module import *`: "
        "what it is cannot be told without importing that module.",
        "Import the name explicitly (e.g. `import torch.nn as nn`), then run the tool again.",
    ),
    "MGP254": (
        "guard-needs-condition",
        "A statement under the GPU guard needs the guard's condition to hold (`.cuda()` needs a GPU), so the "
        "guard cannot be extended to every process. A multi-process run where the condition is false does not "
        "wrap; after `mgpu_runtime.setup()` the runtime stops such a run at its first optimizer step "
        "(`UnsynchronizedTrainingError`).",
        "To train there, move the wrap out from under the condition, so that every process runs it.",
    ),
    "MGP255": (
        "wrapper-dropped-again",
        "The wrapper is taken off again (`model = model.module`) before training: it only serves to load a "
        "checkpoint saved from a wrapped model, and the bare model trains. A DDP wrapper dropped that way would "
        "leave the processes training unsynchronized copies, so the file is left as it is.",
        "Load the checkpoint into the bare model (strip the `module.` prefix), then wrap the model that trains.",
    ),
    "MGP256": (
        "wrap-switched-off",
        "The wrap sits under a flag set to False (`USE_DATA_PARALLEL = False`): it never runs, so the original "
        "never parallelized. Extending the guard would turn it on, so the file is left as it is.",
        "Nothing; set the flag and run the tool again to migrate the file.",
    ),
    "MGP260": (
        "per-row-randomness",
        "The training loop draws random numbers for each row of the batch in a way the runtime does not draw "
        "for the global batch (an in-place `normal_()` fill, `torch.bernoulli`, a size that is the batch's but "
        "not its rows first). The runtime keeps every process's torch generator where the original's was, "
        "seeded or not, so every process would draw the first rows' numbers for its own rows. The file is left "
        "as it is.",
        "Draw with `torch.randn`/`rand(x.size(0), ...)`, `randn_like`/`rand_like(x)` or "
        "`torch.randint(low, high, (x.size(0), ...))`, which the runtime draws for the global batch and slices, "
        "then migrate; or use `--to balanced`.",
    ),
    "MGP330": (
        "rank-mean-metric",
        "A training loop whose data is split adds up a mean over this process's rows that is no loss (an accuracy "
        "`(pred == y).float().mean()`): printed, logged or compared with the best so far, it is the process's "
        "share of the batch, not the batch's.",
        "Weigh it by the rows it averaged over: `mgpu_runtime.reduce_mean(value, count=len(y))` is the global "
        "batch's mean; or count instead (`correct += (pred == y).sum()`), which the tool sums over the processes "
        "(MGP180).",
    ),
    "MGP331": (
        "rank-count-metric",
        "Under `--style torch`, a training loop whose data is split adds up a count of this process's rows "
        "(`correct += pred.eq(y).sum().item()`, `total += y.size(0)`): printed, logged or compared with the best "
        "so far, it is the process's share of the batch, not the batch's.",
        "Sum it over the processes before it is read (`dist.all_reduce` of a tensor holding it), or migrate with "
        "the default style, which sums it with `mgpu_runtime.reduce_sum` (MGP180).",
    ),
    "MGP332": (
        "writer-on-every-process",
        "A TensorBoard `SummaryWriter` is built by every process of the distributed run: each writes an event "
        "file of its own into the log directory, so TensorBoard shows every scalar, image and histogram once per "
        "process (the values are the same where they are global, such as the runtime's losses).",
        "Build it on the main process only (`writer = SummaryWriter(...) if mgpu_runtime.is_main_process() else "
        "None`) and log under `if writer is not None:`, or give each process a directory of its own.",
    ),
    "MGP333": (
        "whole-ddp-pickled",
        "Under `--style torch`, `torch.save(model, path)` pickles torch's `DistributedDataParallel` itself: "
        "loading that file needs a process group set up (its unpickling looks for one), while the original's "
        "file held an `nn.DataParallel` that loads with torch alone, into loader code that goes on with "
        "`model.module` or `model.eval()`.",
        "Save what the original saved: `torch.save(torch.nn.DataParallel(model.module), path)`; or migrate "
        "with the default style, whose wrapper pickles as that DataParallel.",
    ),
    "MGP334": (
        "conditional-count",
        "A training loop whose data is split adds up a count of this process's rows under an `if` (or a `try`) "
        "of the loop: printed or logged, it is the process's share. The tool does not sum it there: the test may "
        "hold on some processes only (`if mask.any():`), and a sum that the others never reach waits forever.",
        "Sum the count over the processes where every process passes, after the loop "
        "(`correct = mgpu_runtime.reduce_sum(correct)`), or count unconditionally (a count of zero rows is 0).",
    ),
    "MGP261": (
        "file-written-by-every-process",
        "A file is written by every process: all write it at once, so one process's content wins, lines are "
        "duplicated, or it comes out garbled.",
        "Unless each process writes a file of its own, do it under `if mgpu_runtime.is_main_process():`, "
        "writing values reduced over the processes (e.g. `mgpu_runtime.reduce_mean(loss.detach())`).",
    ),
    "MGP262": (
        "trained-elsewhere",
        "This file has no training loop: the wrapped model is trained in code it does not show (a caller, "
        "another module), whose data loader the tool does not distribute. Until it is, every process trains on "
        "whole batches.",
        "Pass the training DataLoader through `mgpu_runtime.distribute_loader(...)` where it is built.",
    ),
    "MGP263": (
        "evaluation-script",
        "The file only evaluates (the model runs here, with no backward pass and no optimizer, and goes nowhere "
        "else): one process per GPU would evaluate everything once per process, where DataParallel splits each "
        "batch over the GPUs. The file is left as it is.",
        "Nothing; add `# noqa: MGP263` at the wrap to migrate it anyway.",
    ),
    "MGP264": (
        "rows-compared",
        "The loss compares the rows of the batch with each other (`cdist`, a similarity matrix, batch-wide "
        "statistics): under DDP each process would compare only its own rows, another loss than the "
        "original's. The file is left as it is.",
        "Use `--to balanced`, which keeps one process and is exact for such losses.",
    ),
    "MGP280": (
        "project-data-parallel",
        "The wrap is the project's own subclass of DataParallel, defined in another module of the project (a "
        "CornerNet-style `DataParallel(chunk_sizes=...)`, a vendored sync-BN wrapper). It scatters, gathers or "
        "replicates its own way, which neither the balanced runtime nor DistributedDataParallel reproduces. "
        "Under --to ddp the whole file is left as it is.",
        "Use `nn.DataParallel` at this site if the subclass adds nothing the training needs, then run the tool "
        "again; otherwise migrate the subclass's callers by hand.",
    ),
    "MGP281": (
        "hand-written-data-parallel",
        "The model is run over devices by hand (`replicate`, `scatter`, `parallel_apply`, `gather`), in this "
        "file or in a project helper it calls. The tool rewrites torch's DataParallel, not its pieces. Under "
        "--to ddp the whole file is left as it is.",
        "Replace the hand-written helper with `nn.DataParallel(model)`, then run the tool again; or migrate "
        "by hand.",
    ),
    "MGP282": (
        "per-process-step",
        "A statement before `backward` decides from the batch whether to take the training step (`if "
        "loss == 0: continue`, `if labels.numel() == 0: continue`, a `try: ... except: continue` around the "
        "step). Under DDP each process would decide alone from its own rows: one process skips while another "
        "reduces its gradients, the reductions of different steps pair up, and training drifts without an "
        "error. The file is left as it is.",
        "Make the decision the same on every process (from the whole batch, or agreed across processes), or "
        "remove it; then run the tool again. `--to balanced` keeps one process and is exact.",
    ),
    "MGP283": (
        "chosen-devices",
        "`device_ids` names the GPUs DataParallel uses (`device_ids=args.gpus`). Under DDP every visible GPU "
        "runs one process, so a user who picked 2 of 8 GPUs would get 8 processes. The file is left as it is.",
        "Choose the GPUs when launching (`CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node=2 ...`), drop "
        "`device_ids` from the wrap, then run the tool again.",
    ),
    "MGP285": (
        "trained-elsewhere",
        "The model wrapped here is trained in another module of the project (a `Trainer` class that calls "
        "`backward`). Its data, loss and saves are there, and a migration of the wrap alone would give every "
        "process whole batches and the same checkpoint files. The file is left as it is.",
        "Migrate the module that trains the model together with this one, or use `--to balanced`, which keeps "
        "one process.",
    ),
    "MGP286": (
        "evaluated-elsewhere",
        "The model wrapped here only goes to evaluation code of the project (no backward pass, no optimizer). "
        "DataParallel serves evaluation better than one process per GPU, which would each evaluate the whole "
        "data set. The file is left as it is.",
        "Nothing, unless the project trains the model elsewhere: then migrate that module.",
    ),
    "MGP287": (
        "uneven-project-loss",
        "A loss class of the project ranks the rows of the batch (`topk`, `sort`: OHEM) or averages over a "
        "count that varies with them (`masked_select`, `ignore_index`). Under DDP each process's loss over its "
        "own rows, averaged, is another loss than the original's. The file is left as it is.",
        "Use `--to balanced`, which keeps the whole batch in one process and is exact for such losses.",
    ),
    "MGP289": (
        "unsplit-data",
        "The file trains (a backward pass) and builds a `DataLoader`, but no loader of it reaches the training "
        "loop in a way the tool follows (a helper of another module, a dict of loaders indexed by the phase, "
        "`next(iter(loader))` each step, whose iterator ends before the backward pass), so none was split across the processes, and no other diagnostic "
        "gave a reason that keeps the migration right (a loss summed by hand, MGP236). Every process would train "
        "on whole batches: correct only when they draw the same ones, and no faster than one process. A file "
        "whose data is not split gains nothing from DDP, so it is left as it is (the whole file).",
        "Pass the training loader through `mgpu_runtime.distribute_loader(...)` where it is built (only the one "
        "that trains) and migrate the file again, or use `--to balanced`, which keeps one process.",
    ),
    "MGP265": (
        "mixed-rows",
        "The training loop permutes the rows of the batch (mixup, CutMix: `index = torch.randperm(x.size(0))`, "
        "then `lam * x + (1 - lam) * x[index]`). Under DDP each process holds only its rows, so it would mix "
        "only those: another augmentation and another loss, which no split of the data can make the original's "
        "without moving rows between processes. The file is left as it is.",
        "Use `--to balanced`, which keeps the whole batch in one process and is exact for it.",
    ),
    "MGP266": (
        "replication-callback",
        "The file uses the Synchronized-BatchNorm package's replication callbacks (`patch_replication_callback`, "
        "`DataParallelWithCallback`, `__data_parallel_replicate__`): they synchronise BatchNorm statistics across "
        "the replicas DataParallel makes. DDP makes no replicas, so the callback would never run (BatchNorm per "
        "process) or fail an assertion at start-up. The file is left as it is.",
        "Use `--to balanced` (its replicate calls `__data_parallel_replicate__`), or replace the package's "
        "BatchNorm with `nn.BatchNorm2d` and migrate with `--to ddp --sync-bn`.",
    ),
    "MGP340": (
        "unused-noqa",
        "The rule that has the code looked at this file and found nothing at that line to silence, or the code "
        "is none of mgpu-migrate's; the comment does nothing (ruff's RUF100).",
        "Remove the code from the comment, or correct it (`--list-codes`). Codes of other tools and a bare "
        "`# noqa` are left alone.",
    ),
    "MGP341": (
        "wrap-kept-by-noqa",
        "`--to ddp` migrates a file entirely or not at all: a DataParallel wrap that a `# noqa` keeps leaves every "
        "other site of the file as it was, which the comment on one line does not show.",
        "Remove the `# noqa` from the wrap to migrate the file, or add MGP341 to it (`# noqa: MGP101, MGP341`) "
        "when the file is to stay DataParallel.",
    ),
    "MGP310": (
        "numpy-draws-per-row",
        "The training loop, or a function or method of the project it calls (the message names the draw's "
        "line), draws from numpy's or Python's generator for the batch's rows (a mixup lambda per pair of rows, "
        "`np.random.beta(a, a, len(x))`), or once a step in a file that seeds neither generator (CutMix's "
        "`np.random.rand(1)`). The original drew once for the whole batch; under DDP each process would draw "
        "for its own rows from its own generator (seeded alike: every process gets the first rows' numbers; "
        "unseeded: a coefficient or decision of its own). The runtime keeps torch's generators in step and "
        "slices torch's per-row draws, not numpy's. The file is left as it is.",
        "Use `--to balanced` (one process draws for the whole batch), or draw with torch for the batch's rows "
        "(`torch.rand(len(x))`, transformed as needed), which the runtime makes the original's, or seed numpy "
        "alike in every process for a draw once a step, then migrate.",
    ),
    "MGP311": (
        "repeated-rows-draw",
        "A function of the project that the training loop calls draws torch random numbers for copies of the "
        "batch laid end to end (`dup = x.expand(n, *x.shape).reshape(-1, ...)`, then `torch.randn_like(dup)`: "
        "sliced score matching's particles). The runtime makes a per-row draw the original's by drawing it for "
        "the global batch and keeping the process's rows; a process's rows of a repeated batch are no "
        "contiguous piece of that draw. The file is left as it is.",
        "Use `--to balanced`, or draw per copy (`torch.randn_like(x)` once per particle, then concatenate), "
        "which the runtime slices, then migrate.",
    ),
    # --style torch (the plain-PyTorch scaffold).
    "MGP295": (
        "torch-style-needs-runtime",
        "A rewrite this file needs (named in the message by its code) is made only through `mgpu_runtime` (an "
        "explicit device, a loss computed per device, a count summed over processes ...). `--style torch` writes "
        "no runtime call, and a file half migrated would train differently, so the file is left as it is.",
        "Migrate it with the default style (`--to ddp`), or make that part plain first and run again.",
    ),
    "MGP296": (
        "no-torch-form",
        "The site has no textbook form the tool can write exactly: a loader without `batch_size`, with its own "
        "sampler or shared with evaluation, a shuffled loader with no `for epoch in range(...)` around its "
        "training loop for `set_epoch`, a loss weighted by its targets (`weight=`, `ignore_index=`), a save "
        "inside an expression, or the name `dist` already taken. The file is left as it is.",
        "Migrate it with the default style, whose runtime handles these, or write that part by hand.",
    ),
    "MGP297": (
        "ddp-loss-scale",
        "DDP averages the processes' gradients. For a mean over rows on equal shares that is the original's "
        "gradient; a `reduction='sum'` loss then steps 1/world_size as far, and a cross-entropy or NLL mean is "
        "over the targets not ignored in each process, which differs when some targets are `ignore_index`.",
        "For a sum, multiply the learning rate (or the loss) by `dist.get_world_size()`; for ignored targets, "
        "sum the loss and the count of kept targets over processes (`dist.all_reduce`) or use the default style.",
    ),
    "MGP298": (
        "distributed-sampler-order",
        "`DistributedSampler(shuffle=True)` permutes the dataset with its own generator (`seed` + epoch) and "
        "deals it out to the processes in turn: the batches are not the ones the original's loader drew.",
        "Nothing, if a different shuffle is fine (it usually is). For the original's exact batches use the "
        "default style, whose loader keeps the original sampler's order.",
    ),
    "MGP299": (
        "global-batch-divides",
        "Each process reads `batch_size // world_size` rows a step: the global batch is the original's only when "
        "the batch size divides by the number of processes. `DistributedSampler` gives every process the same "
        "number of samples by repeating some when `len(dataset)` does not divide, so such an epoch sees a few "
        "samples twice (and the last, smaller batch is split the same way).",
        "Pick a batch size and process count that divide, or pass `drop_last=True` to the sampler to drop the "
        "tail instead of repeating it; the default style is exact for any sizes.",
    ),
}


def _kebab(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).lower()


def _review_page(code: str, name: str, summary: str, why: str, todo: str, owner: str) -> str:
    return (
        f"# {code} ({name}): {summary}\n\nReported by {owner}.\n\n## What it found\n{summary[0].upper()}{summary[1:]}.\n\n"
        f"## Why it was left\n{why}\n\n## What to do\n{todo}\n"
    )


def _build() -> dict[str, CodeInfo]:
    from mgpu_migrate.rules import RULES

    codes: dict[str, CodeInfo] = {}
    for code, (name, summary, what, todo) in _ERROR_PAGES.items():
        page = f"# {code} ({name}): {summary}\n\n## What happened\n{what}\n\n## What to do\n{todo}\n"
        codes[code] = CodeInfo(code, name, ERROR, summary, page, None)
    for rule in RULES:
        doc = inspect.cleandoc(rule.__doc__ or "")
        owner = f"{rule.__name__} ({rule.CODE}: {rule.DESCRIPTION})"
        if rule.CODE not in rule.REVIEW_CODES:
            name = _kebab(rule.__name__)
            listed = "".join(f"- {code}: {summary}\n" for code, summary in rule.REVIEW_CODES.items())
            page = f"# {rule.CODE} ({name}): {rule.DESCRIPTION}\n\n{doc}\n"
            if listed:
                page += f"\n## Sites this rule leaves for review (see their own pages)\n{listed}"
            codes[rule.CODE] = CodeInfo(rule.CODE, name, REWRITE, rule.DESCRIPTION, page, rule.__name__)
        for code, summary in rule.REVIEW_CODES.items():
            # A code without its page yet still explains its summary (the registry test asks for the page).
            name, why, todo = _REVIEW_PAGES.get(code, (code.lower(), summary, "See the rule's documentation below."))
            page = _review_page(code, name, summary, why, todo, owner)
            if code == rule.CODE:
                page += f"\n## The rule\n{doc}\n"
            codes[code] = CodeInfo(code, name, REVIEW, summary, page, rule.__name__)
    return dict(sorted(codes.items()))


CODES: dict[str, CodeInfo] = _build()


def lookup(code: str) -> CodeInfo | None:
    """The registered code, whatever its case (``mgp232`` is MGP232); None when there is none."""
    return CODES.get(code.strip().upper())
