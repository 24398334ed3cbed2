const std = @import("std");

/// The largest value in a non-empty slice.
fn max(values: []const i32) i32 {
    var best = values[0];
    for (values[1..]) |v| {
        ‸
    }
    return best;
}

pub fn main() void {
    const values = [_]i32{ 3, 9, 2, 7 };
    std.debug.print("{d}\n", .{max(&values)});
}
