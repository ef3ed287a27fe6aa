"""What can be observed about a job from outside it: live stacks (py-spy), the
Flight Recorder's dumps, the CPU activity of its processes."""
