"""Published models: what the Qwen-Omni checkpoints a user brings hold (:mod:`.published`), stand-ins of them
generated in code (:mod:`.standin`), a check of a checkpoint directory (:mod:`.check`) and the sizes a run at full
depth needs (:mod:`.sizes`). ``relax-gym model ...`` (:mod:`.cli`) is the command line. Nothing is imported here:
each module loads when used."""
