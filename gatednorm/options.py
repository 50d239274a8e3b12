"""GatedNormOptions: every option of the gated RMSNorm as one frozen, hashable value."""

from __future__ import annotations

from typing import NamedTuple

from gatednorm.validation import check_group_size, check_group_size_type, check_options


class GatedNormOptions(NamedTuple):
    """The options of :func:`gatednorm.rms_norm_gated` (see there for their meaning).

    A named tuple: immutable, hashable (usable in cache keys), cheap to build, and traced
    by torch.compile as plain constants. Build it with :meth:`checked`, which validates every
    value once; the host path then passes the one value around instead of six arguments.
    ``group_size`` is None (the whole last dim) until :meth:`for_hidden_size` resolves it.

    The first six fields are the registered ops' schema after the tensors
    (``torch.ops.gatednorm.rms_norm_gated_fwd``): :meth:`op_arguments`. A new option (an
    output quantization, say) gets a field with a default after them, a check in
    :meth:`checked`, its keyword in ``gatednorm.functional.rms_norm_gated`` and
    ``RMSNormGated``, its place in the raw tuple that ``gatednorm.dispatch.call_key`` reads,
    and, when it needs other kernels, its own exit in ``gatednorm.dispatch.run``.
    """

    eps: float = 1e-6
    zero_centered_gamma: bool = False
    activation: str = "silu"
    norm_before_gate: bool = True
    group_size: int | None = None
    rounding: str = "te"

    @classmethod
    def checked(cls, eps: float = 1e-6, zero_centered_gamma: bool = False,
                activation: str = "silu", norm_before_gate: bool = True,
                group_size: int | None = None, rounding: str = "te") -> "GatedNormOptions":
        """The options after every check that needs no tensor; raises TypeError or
        ValueError naming the bad argument. eps becomes a float, group_size an int."""
        check_options(eps=eps, activation=activation, rounding=rounding,
                      zero_centered_gamma=zero_centered_gamma, norm_before_gate=norm_before_gate)
        check_group_size_type(group_size)
        return cls(float(eps), zero_centered_gamma, activation, norm_before_gate,
                   None if group_size is None else int(group_size), rounding)

    def for_hidden_size(self, hidden_size: int) -> "GatedNormOptions":
        """These options with group_size an int dividing ``hidden_size`` (ValueError if it
        does not divide it)."""
        return self._replace(group_size=check_group_size(self.group_size, hidden_size))

    def op_arguments(self) -> tuple:
        """The values the registered ops take after their tensors, in schema order."""
        return (self.eps, self.zero_centered_gamma, self.activation, self.norm_before_gate,
                self.group_size, self.rounding)
