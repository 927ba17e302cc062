"""The GDRO step API (:mod:`.controller`, :mod:`.config`, :mod:`.context`, :mod:`.sampler`): what the
trainer, the CPU demo and anyone's own loop call, so it imports neither verl nor torch."""
