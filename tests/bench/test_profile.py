"""`hgrn2 bench profile`: the kernels of a step in launch order."""

from hgrn2.bench.profile import launch_order


def test_profile_launch_order_labels_a_kernels_second_launch_and_averages_over_steps():
    one = [("decay", 1.0), ("small", 2.0), ("small", 4.0)]
    two = [("decay", 3.0), ("small", 6.0), ("small", 8.0)]
    assert launch_order(one + two, steps=2) == [("decay", 2.0), ("small", 4.0), ("small#2", 6.0)]
