"""Static link check of the files a series touches: nothing is imported.

Job: parse the *patched* source of every touched ``.py`` file and resolve,
against a source tree (the patched files as an overlay over the pristine vLLM
tree and the pinned third-party sources):

* every ``import`` / ``from ... import`` (also inside functions): the module
  must exist and define the name, following ``__init__`` re-exports,
  ``from x import *`` and ``__all__``;
* every call into a statically resolvable function or class: positional
  count, keyword names and required parameters must bind to the signature
  (``__init__`` through the MRO, dataclass-like fields, bound methods);
* every ``self.X`` read in a method of a class defined in a touched file: X
  must be assigned in the class or a base, or be a class attribute/method.

Boundary: only top-level packages found in the tree (``vllm``, ``flashinfer``)
are checked; everything else (torch, triton, the stdlib, other dependencies) is
trusted as external. Anything dynamic is trusted rather than guessed: a module
``__getattr__``, a non-literal ``__all__``, a class with an external base other
than ``object``/``ABC``/``Generic``/``Protocol``/``torch.nn.Module``, a class
or base defining ``__getattr__``, callees behind unknown decorators, ambiguous
(conditional) definitions. Truly dynamic names are allowlisted in series.toml
under ``[linkcheck.allow]`` as ``"<touched path>:<subject>" = "<reason>"``.

Modules, each importing only those above it in this list: ``findings`` (what is
reported), ``sources`` (where module text comes from), ``symbols`` (what a name
resolves to), ``scopes`` (what a scope binds, from the AST), ``index`` (module-level
name resolution), ``classes`` (class models, MRO, attribute lookup), ``signatures``
(call binding), ``checker`` (the walk over one file), ``run`` (the entry points).
"""

from bakery.check.linkcheck.findings import Finding, format_finding
from bakery.check.linkcheck.run import check_touched_files, package_root, run_linkcheck
from bakery.check.linkcheck.sources import SourceTree

__all__ = [
    "Finding",
    "SourceTree",
    "check_touched_files",
    "run_linkcheck",
    "format_finding",
    "package_root",
]
