"""A torch.nn module tree as it was before a call that must be all or nothing (parallelize_module,
distribute_module, a style's apply): what those calls and the Python styles they run may change,
put back when the call raises on any rank."""


class ModuleSnapshot:
    """Every module's attributes (``__dict__``, and in place the dicts it holds: parameters,
    buffers, submodules, hooks), its class, and its parameters' ``requires_grad``. Tensors
    written in place are not covered: the styles replace parameters, they never write them."""

    def __init__(self, module):
        self._entries = []
        for m in module.modules():
            attrs = dict(m.__dict__)
            dicts = [(d, d.copy()) for d in attrs.values() if isinstance(d, dict)]
            grads = [(p, p.requires_grad) for p in m._parameters.values() if p is not None]
            self._entries.append((m, type(m), attrs, dicts, grads))

    def restore(self):
        for m, cls, attrs, dicts, grads in self._entries:
            for d, saved in dicts:
                d.clear()
                d.update(saved)
            m.__dict__.clear()
            m.__dict__.update(attrs)
            if type(m) is not cls:
                m.__class__ = cls
            for p, requires_grad in grads:
                if p.requires_grad != requires_grad:
                    p.requires_grad_(requires_grad)


def all_or_nothing(module, call):
    """``call()``'s result; when it raises, ``module`` is first put back as it was."""
    snapshot = ModuleSnapshot(module)
    try:
        return call()
    except BaseException:
        snapshot.restore()
        raise
