"""Direct data paths of a channel, chosen by where producer and consumer run (paper section 3.5).

Ray stays the control plane: a consumer *binds* a key of a channel to its process (the channel's
queue actor records the binding, metadata only), and a producer looks the binding up once. From
then on items of that key skip the queue actor and the object store, over one of three
transports (:mod:`.router` chooses by placement; :mod:`.base` is their common interface):

* same process (:mod:`.local`): the object itself is handed over (no copy, no serialisation);
* same node, other process (:mod:`.same_node`): one Unix-domain socket per (channel, producer,
  consumer); tensors and arrays travel as pickle protocol-5 out-of-band buffers
  (:mod:`.codec`): up to ``SHM_MIN_BYTES`` through the socket, larger ones in a ``memfd``
  shared-memory file whose descriptor is passed along (``SCM_RIGHTS``), so the consumer maps
  the producer's copy instead of copying it again;
* other node (:mod:`.remote`): a TCP connection to the consumer's node, buffers inline (the same
  framing, :mod:`.wire`).

Accelerator tensors are staged to host memory by the channel before they get here and restored
onto the consumer's device after (:mod:`rlinf_embodied.runtime.device`), so these modules only
ever see host memory and are device-agnostic.

Each process has at most one :class:`~.endpoint.Endpoint` (started by the first bind): a
listening socket pair, one reader thread per incoming connection and the inboxes the consumer's
``get`` takes from (:mod:`.endpoint`).
"""
