//! The image build's progress during start-up: the start-up phase (for `/readyz` and calls
//! waiting for it), and stderr: a progress bar on a terminal, plain lines otherwise (CI,
//! compose logs).

use std::sync::Arc;

use crate::app::{Phase, Startup};
use crate::backend::image;

/// Tells the image build's progress: the start-up phase (for `/readyz` and waiting calls),
/// and stderr: a progress bar on a terminal, plain lines otherwise (CI, compose logs).
pub(super) struct BuildReport {
    startup: Arc<Startup>,
    terminal: bool,
    /// A progress bar is drawn on the current line.
    bar_drawn: bool,
}

impl BuildReport {
    pub(super) fn new(startup: Arc<Startup>) -> BuildReport {
        use std::io::IsTerminal as _;
        BuildReport {
            startup,
            terminal: std::io::stderr().is_terminal(),
            bar_drawn: false,
        }
    }

    pub(super) fn event(&mut self, e: &image::BuildEvent) {
        match e {
            image::BuildEvent::Started { .. } => {
                self.startup.set(Phase::BuildingImage { step: None });
                self.line(e);
            }
            image::BuildEvent::Step { index, total, name } => {
                self.startup.set_build_step(e.to_string());
                if self.terminal {
                    self.bar(*index, *total, name);
                } else {
                    self.line(e);
                }
            }
            image::BuildEvent::Note(_) | image::BuildEvent::Finished { .. } => self.line(e),
        }
    }

    fn line(&mut self, e: &image::BuildEvent) {
        let indent = if matches!(e, image::BuildEvent::Step { .. }) {
            "  "
        } else {
            ""
        };
        if self.bar_drawn {
            // Carriage return, erase the line: the bar's place goes to this line.
            eprint!("\r\x1b[2K");
            self.bar_drawn = false;
        }
        say!("mcp-code-executor: {indent}{e}");
    }

    fn bar(&mut self, index: usize, total: usize, name: &str) {
        const WIDTH: usize = 24;
        let done = (index * WIDTH / total.max(1)).min(WIDTH);
        let name: String = name.chars().take(40).collect();
        eprint!(
            "\r\x1b[2Kmcp-code-executor: [{}{}] step {index} of {total}: {name}",
            "#".repeat(done),
            "-".repeat(WIDTH - done)
        );
        self.bar_drawn = true;
    }
}
