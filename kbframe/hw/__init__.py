"""PE hardware units, one module per unit. Each unit is declared in ``conf/hardware`` with
a ``_target_`` naming its class here and is built by the engine with
``hydra.utils.instantiate``."""
