package pgtest

// Lines is the child's stdout, line by line, closed when the child has
// exited: for tests that watch many children at once with select. Use
// either Lines or Expect on a child, not both, and read Lines until it is
// closed before calling Wait.
func (c *Child) Lines() <-chan string { return c.lines }
