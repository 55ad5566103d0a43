"""orbax.checkpoint of the stand-in: a CheckpointManager of Composite items of JSON, each step a
folder committed by renaming, written by process 0 only (as Orbax writes JSON items on the
primary host)."""

import json
import os
import shutil

import jax

from . import args  # noqa: F401  (ocp.args.Composite, JsonSave, JsonRestore)


class CheckpointManagerOptions:
    def __init__(self, max_to_keep=None, **kwargs):
        self.max_to_keep = max_to_keep


class _Restored(dict):
    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class CheckpointManager:
    def __init__(self, directory, options=None):
        self.directory = os.fspath(directory)
        self.options = options or CheckpointManagerOptions()
        os.makedirs(self.directory, exist_ok=True)

    def all_steps(self):
        return sorted(int(n) for n in os.listdir(self.directory) if n.isdigit())

    def latest_step(self):
        steps = self.all_steps()
        return steps[-1] if steps else None

    def save(self, step, args):
        if not isinstance(args, args_module.Composite):
            raise TypeError("the stand-in saves ocp.args.Composite items only")
        if jax.process_index() != 0:
            return True
        tmp = os.path.join(self.directory, f"{step}.orbax-checkpoint-tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for name, item in args.items():
            if not isinstance(item, args_module.JsonSave):
                raise TypeError(f"item {name!r}: the stand-in saves ocp.args.JsonSave only")
            with open(os.path.join(tmp, name + ".json"), "w") as f:
                json.dump(item.item, f)
        os.rename(tmp, os.path.join(self.directory, str(step)))
        keep = self.options.max_to_keep
        if keep:
            for old in self.all_steps()[:-keep]:
                shutil.rmtree(os.path.join(self.directory, str(old)))
        return True

    def restore(self, step, args):
        path = os.path.join(self.directory, str(step))
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no checkpoint of step {step} in {self.directory}")
        out = _Restored()
        for name, item in args.items():
            if not isinstance(item, args_module.JsonRestore):
                raise TypeError(f"item {name!r}: the stand-in restores ocp.args.JsonRestore only")
            with open(os.path.join(path, name + ".json")) as f:
                out[name] = json.load(f)
        return out

    def wait_until_finished(self):
        pass

    def close(self):
        pass


args_module = args
