"""The shared analysis of wrapped models and their outputs (analysis/scopes.py, analysis/models.py)."""

import textwrap

import libcst as cst

from mgpu_migrate.analysis import FileAnalysis, names


def analyse(source: str) -> FileAnalysis:
    source = textwrap.dedent(source)
    return FileAnalysis("example.py", source, cst.parse_module(source))


def wrapped_paths(analysis: FileAnalysis) -> set[str]:
    return {f"{scope!r}:{path}" for (scope, path), sites in analysis.models.wrapped.items() if sites}


def output_paths(analysis: FileAnalysis) -> set[str]:
    return {f"{scope!r}:{path}" for (scope, path), sites in analysis.models.outputs.items() if sites}


class TestPlaces:
    def test_attributes_of_self_belong_to_the_class_in_every_method(self):
        analysis = analyse(
            """
            import torch
            class Trainer:
                def __init__(self, net):
                    self.net = torch.nn.DataParallel(net)
                def step(self, x):
                    out = self.net(x)
            """
        )
        assert wrapped_paths(analysis) == {"Scope(Trainer):self.net"}
        assert output_paths(analysis) == {"Scope(step):out"}

    def test_an_instance_of_a_class_of_the_file_reaches_its_attributes(self):
        analysis = analyse(
            """
            import torch
            class Holder:
                def __init__(self, net):
                    self.net = torch.nn.DataParallel(net)
            holder = Holder(net)
            out = holder.net(x)
            """
        )
        assert "Scope(<module>):out" in output_paths(analysis)

    def test_a_name_assigned_other_values_too_is_not_an_instance(self):
        analysis = analyse(
            """
            import torch
            class Net(torch.nn.Module):
                pass
            model = Net()
            model = torch.nn.DataParallel(model)
            """
        )
        assert wrapped_paths(analysis) == {"Scope(<module>):model"}

    def test_a_class_body_name_is_not_seen_from_its_methods(self):
        analysis = analyse(
            """
            import torch
            model = torch.nn.DataParallel(net)
            class A:
                model = None
                def run(self, x):
                    return model(x)
            """
        )
        run = next(node for node in analysis.flow.scopes if isinstance(node, cst.FunctionDef))
        assert analysis.flow.scopes[run].lookup("model") is analysis.flow.module_scope


class TestWrappedModels:
    def test_followed_into_functions_of_the_file_and_out_of_builders(self):
        analysis = analyse(
            """
            import torch.nn as nn
            def init_net(net, gpu_ids):
                net = nn.DataParallel(net, gpu_ids)
                return net
            def train(model, x):
                return model(x)
            model = init_net(build(), [0, 1]).cuda()
            out = train(model, x)
            """
        )
        assert {"Scope(init_net):net", "Scope(<module>):model", "Scope(train):model"} <= wrapped_paths(analysis)
        assert "Scope(<module>):out" in output_paths(analysis)

    def test_items_of_lists_and_module_lists(self):
        analysis = analyse(
            """
            import torch.nn as nn
            members = nn.ModuleList([nn.DataParallel(m) for m in ms])
            for i in range(3):
                others[i] = nn.DataParallel(others[i])
            for index, member in enumerate(members):
                a = member(x)
            b = others[0](x)
            """
        )
        assert {"Scope(<module>):members[]", "Scope(<module>):others[]", "Scope(<module>):member"} <= wrapped_paths(
            analysis
        )
        assert {"Scope(<module>):a", "Scope(<module>):b"} <= output_paths(analysis)

    def test_unpacked_and_picked_outputs_are_outputs_computed_ones_are_derived(self):
        analysis = analyse(
            """
            import torch.nn as nn
            model = nn.DataParallel(model)
            main, aux = model(x)
            logits = model(x).logits
            loss = model(x)[0].mean()
            shape = model(x).shape
            """
        )
        assert output_paths(analysis) == {
            "Scope(<module>):main",
            "Scope(<module>):aux",
            "Scope(<module>):logits",
        }
        derived = {path for (_, path), sites in analysis.models.derived.items() if sites}
        assert "loss" in derived and "shape" not in derived

    def test_a_local_data_parallel_is_not_torchs(self):
        analysis = analyse(
            """
            class DataParallel:
                pass
            model = DataParallel(model)
            """
        )
        assert analysis.models.sites == []

    def test_a_file_without_a_wrap_site_skips_the_scope_pass(self):
        analysis = analyse("import torch\nmodel = torch.nn.Linear(2, 2)\n")
        assert analysis.models.sites == []
        assert "flow" not in analysis.__dict__

    def test_subclasses_through_each_other(self):
        analysis = analyse(
            """
            from torch.nn.parallel import DataParallel
            class Base(DataParallel):
                pass
            class Child(Base):
                pass
            model = Child(net)
            """
        )
        assert {cls.name.value for cls in analysis.models.subclasses} == {"Base", "Child"}
        assert [site.kind for site in analysis.models.sites] == ["subclass"]


class TestWhereOutputsGo:
    def test_backward_through_tensor_operations_covers_a_loss_inside_the_model(self):
        analysis = analyse(
            """
            import torch
            model = torch.nn.DataParallel(model)
            outputs = model(ids, labels=labels)
            loss = outputs[0]
            loss = loss.mean()
            scaler.scale(loss).backward()
            """
        )
        assert analysis.models.backward_sites() == frozenset(analysis.models.sites)

    def test_escapes_name_the_code_the_outputs_and_the_model_go_to(self):
        analysis = analyse(
            """
            import torch
            model = torch.nn.DataParallel(model)
            out = model(x)
            print(out.argmax(1))
            metric.update(out, y)
            fit(model, loader)
            def make():
                return torch.nn.DataParallel(other)
            """
        )
        models = analysis.models
        first, second = models.sites
        assert [e.what for e in models.output_escapes()[first]] == ["`metric.update(...)`"]
        assert [e.what for e in models.model_escapes()[first]] == ["`fit(...)`"]
        assert [e.what for e in models.model_escapes()[second]] == ["the caller of `make()`"]

    def test_a_sub_module_wrap(self):
        analysis = analyse(
            """
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def __init__(self):
                    self.encoder = nn.DataParallel(Encoder())
                    self.decoder = nn.Linear(8, 2)
            model.features = nn.DataParallel(model.features)
            class Trainer:
                def __init__(self, model):
                    self.model = nn.DataParallel(model)
            class Model(nn.Module):  # RCAN's wrapper: the model is all it holds, so this wraps a whole model
                def __init__(self, args):
                    self.scale = args.scale
                    self.device = torch.device('cuda')
                    self.model = make_model(args).to(self.device)
                    self.model = nn.DataParallel(self.model)
                def forward(self, x):
                    return self.model(x) if self.training else self.forward_chop(x)
                def forward_chop(self, x):
                    return self.model(x)
            """
        )
        assert [analysis.models.is_submodule(site) for site in analysis.models.sites] == [
            "self.encoder",
            "model.features",
            None,
            None,
        ]


def test_names_resolve_loss_modules_and_vendored_encoding_but_not_torch_lookalikes():
    assert names.canonical("torch.nn.modules.loss.CrossEntropyLoss") == "torch.nn.CrossEntropyLoss"
    assert names.canonical("encoding.parallel.DataParallelModel") == names.ENCODING_MODEL
    assert names.canonical(".utils.parallel.DataParallelModel", vendored_encoding=True) == names.ENCODING_MODEL
    assert names.canonical("parallel.DataParallelCriterion", vendored_encoding=True) == names.ENCODING_CRITERION
    # A user's own `parallel` module is PyTorch-Encoding's only where the file says it may be (a PyTorch file).
    assert names.canonical(".utils.parallel.DataParallelModel") == ".utils.parallel.DataParallelModel"
    for qualified in ("torch.nn.parallel.DataParallelModel", "gluoncv.utils.parallel.DataParallelModel",
                      "mxnet.gluon.parallel.DataParallelCriterion"):
        assert names.canonical(qualified, vendored_encoding=True) == qualified


class TestEncodingPairOrigin:
    """PyTorch-Encoding's pair is recognized from `encoding.parallel`, and from a vendored `parallel` module only
    in a file that imports torch and no other framework; GluonCV's (MXNet) pair never."""

    def test_gluoncv_pair_is_not_encoding_by_name_or_star_import(self):
        for header in ("from gluoncv.utils.parallel import DataParallelModel, DataParallelCriterion",
                       "from gluoncv.utils.parallel import *"):
            analysis = analyse(f"import torch\n{header}\nmodel = DataParallelModel(net)\nloss = DataParallelCriterion(l)\n")
            assert not analysis.calls_to(names.ENCODING_MODEL) and not analysis.calls_to(names.ENCODING_CRITERION)

    def test_a_vendored_copy_counts_only_in_a_pytorch_file(self):
        body = "from .utils.parallel import DataParallelModel\nmodel = DataParallelModel(net)\n"
        assert len(analyse("import torch.nn as nn\n" + body).calls_to(names.ENCODING_MODEL)) == 1
        assert len(analyse("from torchvision import models\n" + body).calls_to(names.ENCODING_MODEL)) == 1
        assert not analyse(body).calls_to(names.ENCODING_MODEL)
        assert not analyse("import mxnet as mx\n" + body).calls_to(names.ENCODING_MODEL)
        assert not analyse("import torch\nimport mxnet as mx\n" + body).calls_to(names.ENCODING_MODEL)
        # through a module alias and a star import too
        assert len(analyse("import torch\nfrom utils import parallel\nm = parallel.DataParallelModel(n)\n").calls_to(
            names.ENCODING_MODEL)) == 1
        assert not analyse("from utils.parallel import *\nm = DataParallelModel(n)\n").calls_to(names.ENCODING_MODEL)

    def test_the_package_counts_in_any_file(self):
        analysis = analyse("from encoding.parallel import DataParallelModel\nmodel = DataParallelModel(net)\n")
        assert len(analysis.calls_to(names.ENCODING_MODEL)) == 1


class TestNotModules:
    """A DataParallel wrap of something certainly not an nn.Module is no wrap site; what it wraps is said."""

    @staticmethod
    def not_modules(source: str) -> list[str]:
        analysis = analyse(source)
        found = list(analysis.models.not_modules.values())
        wrapped = {analysis.module.code_for_node(site.call) for site in analysis.models.sites}
        assert not wrapped & {analysis.module.code_for_node(call) for call in analysis.models.not_modules}
        return found

    def test_optimizers_schedulers_tensors_and_literals(self):
        assert self.not_modules(
            """
            import torch
            import torch.nn as nn
            from torch import optim
            from torch.optim.lr_scheduler import StepLR
            a = nn.DataParallel(optim.Adam(params))
            b = nn.DataParallel(StepLR(opt, 10))
            c = nn.DataParallel(torch.zeros(3))
            d = nn.DataParallel([net_a, net_b])
            e = nn.DataParallel(module={"net": net})
            f = nn.DataParallel(None)
            """
        ) == [
            "an optimizer (`torch.optim.Adam`)",
            "a learning-rate scheduler (`torch.optim.lr_scheduler.StepLR`)",
            "a tensor (`torch.zeros`)",
            "a list",
            "a dict",
            "None",
        ]

    def test_names_and_attributes_bound_only_to_an_optimizer(self):
        assert self.not_modules(
            """
            import torch
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            optimizer = torch.nn.DataParallel(optimizer)
            class Trainer:
                def __init__(self, model):
                    self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
                def wrap(self):
                    self.opt = torch.nn.DataParallel(self.opt)
            held = torch.optim.SGD(p, lr=1)
            alias = held
            wrapped = torch.nn.DataParallel(alias)
            """
        ) == ["an optimizer (`torch.optim.SGD`)"] * 3

    def test_what_may_be_a_module_stays_a_site(self):
        assert self.not_modules(
            """
            import torch
            from torch.optim.swa_utils import AveragedModel
            a = torch.nn.DataParallel(AveragedModel(net))
            b = torch.nn.DataParallel(Net())
            def wrap(thing):
                return torch.nn.DataParallel(thing)
            def build(opt=None):
                if opt is None:
                    opt = torch.optim.SGD(p, lr=1)
                return torch.nn.DataParallel(opt)
            x = torch.optim.SGD(p, lr=1)
            for x in modules:
                pass
            c = torch.nn.DataParallel(x)
            y, z = torch.optim.SGD(p, lr=1), net
            d = torch.nn.DataParallel(y)
            from somewhere import w
            w = torch.optim.SGD(p, lr=1)
            e = torch.nn.DataParallel(w)
            """
        ) == []


def test_calls_whose_leftmost_name_may_come_from_a_star_import():
    analysis = analyse(
        """
        from mytools import *
        from torch.nn import *
        a = nn.DataParallel(model)
        b = DataParallel(model)
        import torch
        c = torch.nn.DataParallel(model)
        def f(nn2):
            d = nn2.DataParallel(model)
        e = helpers.data_parallel(model, x)
        """
    )
    found = analysis.unknown_star_calls(frozenset({"DataParallel", "data_parallel"}))
    assert [(analysis.module.code_for_node(call.func), sources) for call, sources in found] == [
        ("nn.DataParallel", ["from mytools import *", "from torch.nn import *"]),
        ("helpers.data_parallel", ["from mytools import *", "from torch.nn import *"]),
    ]
    assert analyse("nn.DataParallel(model)\n").unknown_star_calls(frozenset({"DataParallel"})) == []
