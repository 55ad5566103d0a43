"""jax.distributed of the stand-in: records which process this is (no coordination service)."""

_STATE = {"process_id": 0, "num_processes": 1, "coordinator_address": None}


def initialize(coordinator_address=None, num_processes=None, process_id=None, **kwargs):
    if _STATE["coordinator_address"] is not None:
        raise RuntimeError("jax.distributed.initialize should only be called once.")
    if coordinator_address is None or num_processes is None or process_id is None:
        raise ValueError("the stand-in takes coordinator_address, num_processes and process_id "
                         "(it detects no cluster)")
    host, _, port = coordinator_address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator_address {coordinator_address!r} is not HOST:PORT")
    if not 0 <= process_id < num_processes:
        raise ValueError(f"process_id {process_id} of {num_processes}")
    _STATE.update(process_id=process_id, num_processes=num_processes,
                  coordinator_address=coordinator_address)


def shutdown():
    _STATE.update(process_id=0, num_processes=1, coordinator_address=None)
