"""One module per launcher, each a pure function `launch(job, head) -> Launch` from the
job's spec (plan/launch_plan.py's JobShape) to its files and command lines: pdsh (DeepSpeed's
runner on the head), standard (accelerate on every node), torchrun (which ColossalAI's
recipes ride on too)."""
