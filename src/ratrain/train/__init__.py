"""Training jobs: the distributed job, the train command and the single-process reference trainer."""
