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
            import torch.nn as nn
            class Net(nn.Module):
                def __init__(self):
                    self.encoder = nn.DataParallel(Encoder())
            model.features = nn.DataParallel(model.features)
            class Trainer:
                def __init__(self, model):
                    self.model = nn.DataParallel(model)
            """
        )
        assert [analysis.models.is_submodule(site) for site in analysis.models.sites] == [
            "self.encoder",
            "model.features",
            None,
        ]


def test_names_resolve_loss_modules_and_vendored_encoding_but_not_torch_lookalikes():
    assert names.canonical("torch.nn.modules.loss.CrossEntropyLoss") == "torch.nn.CrossEntropyLoss"
    assert names.canonical(".utils.parallel.DataParallelModel") == names.ENCODING_MODEL
    assert names.canonical("parallel.DataParallelCriterion") == names.ENCODING_CRITERION
    assert names.canonical("torch.nn.parallel.DataParallelModel") == "torch.nn.parallel.DataParallelModel"
