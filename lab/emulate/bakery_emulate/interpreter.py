"""The Triton interpreter, faster and with the same results: what its per-element and
per-launch Python costs in an interpreted V4.1 step. The engine gets it through the hook
in ``patches``; tests/lab/dcp/_dcp_child gives it to the DCP drivers. tests/lab/emulate holds each
against the interpreter's own code, with a plant."""

from __future__ import annotations


def speed_up(module) -> None:
    """Apply both to ``triton.runtime.interpreter``."""
    module.ReduceOps.generic_reduce = folded_reduce(module.ReduceOps.generic_reduce)
    module._patch_builtin = listed_once(module)


def folded_reduce(elementwise):
    """The interpreter reduces with a custom combine (candidate_blocks' NaN-propagating
    max) one element at a time in Python: a quarter of a served V4.1's time. Fold the
    same combine in the same order, one step along the axis over whole slices: every
    output element sees the same calls on the same values, so the bytes are the same."""
    import numpy as np

    def generic_reduce(self, input):
        original_axis = self.axis
        input, axis = self.unravel(input, self.axis)
        data = [arg.handle.data for arg in input]
        if data[0].shape[axis] == 0:
            return elementwise(self, input)
        dtypes = [arg.dtype for arg in input]

        def step(k):
            return [np.take(d, k, axis=axis) for d in data]

        acc = step(0)
        for k in range(1, data[0].shape[axis]):
            ret = self.combine_fn.fn(
                *(self.to_tensor(a, t) for a, t in zip(acc, dtypes, strict=True)),
                *(self.to_tensor(x, t) for x, t in zip(step(k), dtypes, strict=True)),
            )
            ret = ret if isinstance(ret, tuple) else (ret,)
            # As the original stores each result into an array of the input's dtype.
            acc = [
                _like(r.handle.data if hasattr(r, "handle") else r, a, d.dtype)
                for r, a, d in zip(ret, acc, data, strict=True)
            ]
        out = []
        for a, t in zip(acc, dtypes, strict=True):
            a = np.asarray(a)
            if self.keep_dims:
                if original_axis is not None:
                    a = np.expand_dims(a, axis)
                else:
                    a = a.reshape((1,) * len(data[0].shape))
            elif original_axis is None:
                a = a.item()
            out.append(self.to_tensor(a, t))
        return out

    generic_reduce.elementwise = elementwise  # tests/lab/emulate compares the two
    return generic_reduce


def _like(value, shape_of, dtype):
    """``value`` in ``shape_of``'s shape (a scalar comes back as a one-element array)."""
    import numpy as np

    value, shape = np.asarray(value), np.shape(shape_of)
    if value.size == np.size(shape_of):
        return value.reshape(shape).astype(dtype)
    return np.broadcast_to(value, shape).astype(dtype)


def listed_once(module):
    """On every launch the interpreter wraps each builtin of triton.language, found by
    ``inspect.getmembers`` of the whole module (a twentieth of a served V4.1's time).
    List the names once and look at what each holds now: which are builtins changes
    between launches (tl.core.reduce is not while tl's scope has replaced it)."""
    import inspect

    is_builtin = module.tl.core.is_builtin
    names: dict[int, tuple[str, ...]] = {}

    def patch_builtin(pkg, builder, scope):
        if id(pkg) not in names:
            names[id(pkg)] = tuple(name for name, _ in inspect.getmembers(pkg))
        for name in names[id(pkg)]:
            member = getattr(pkg, name)
            if is_builtin(member):
                module._patch_attr(pkg, name, member, builder, scope)

    patch_builtin.every_launch = module._patch_builtin  # tests/lab/emulate compares the two
    return patch_builtin
