"""How env ids are spelled: gymnasium's namespace for ours (``relax/<id>``) and the prefix of a served env's
address (``remote:http://HOST:PORT/ID``). The registry and the remote client both read them."""

NAMESPACE = "relax"
REMOTE_PREFIX = "remote:"
