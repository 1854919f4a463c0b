//! etcd's `/metrics` text (the Prometheus text exposition format), parsed into samples.
//!
//! # Example
//!
//! ```no_run
//! use etcd_sync::testing::{EtcdServer, metrics};
//!
//! let etcd = EtcdServer::start()?;
//! let metrics = metrics::parse(&etcd.metrics()?)?;
//! assert_eq!(metrics.get("etcd_server_is_leader", &[]), Some(1.0));
//! let txns = metrics.sum("grpc_server_handled_total", &[("grpc_method", "Txn")]);
//! println!("{txns} transactions handled");
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io;
use std::net::ToSocketAddrs;

/// Reads and parses `/metrics` from an etcd client URL such as `http://127.0.0.1:2379`
/// (etcd serves it on its client listener too), for drivers that did not start the server.
///
/// # Example
///
/// ```no_run
/// let metrics = etcd_sync::testing::metrics::fetch("http://127.0.0.1:2379")?;
/// println!("{:?}", metrics.get("etcd_server_has_leader", &[]));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn fetch(endpoint: &str) -> io::Result<Metrics> {
    let authority = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let addr = authority.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot resolve {authority}"),
        )
    })?;
    let response = super::http::get(addr, "/metrics")?;
    if response.status != 200 {
        return Err(io::Error::other(format!(
            "GET {endpoint}/metrics: HTTP {}",
            response.status
        )));
    }
    parse(&response.body)
}

/// Parses Prometheus text: one [`Sample`] per line that is neither blank nor a comment
/// (`# HELP`, `# TYPE` and other `#` lines are skipped). Timestamps are accepted and
/// dropped; values may be `+Inf`, `-Inf` or `NaN`.
///
/// # Errors
///
/// [`io::ErrorKind::InvalidData`] naming the first line that is not a sample, such as a
/// line without a value or with an unterminated label value.
///
/// # Example
///
/// ```
/// let text = "# TYPE etcd_server_has_leader gauge\n\
///             etcd_server_has_leader 1\n\
///             grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Txn\"} 42\n";
/// let metrics = etcd_sync::testing::metrics::parse(text)?;
/// assert_eq!(metrics.get("etcd_server_has_leader", &[]), Some(1.0));
/// assert_eq!(metrics.samples().len(), 2);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn parse(text: &str) -> io::Result<Metrics> {
    let mut samples = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let sample = Cursor { rest: line }.sample().map_err(|what| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("line {} of the metrics text: {what}: {line}", index + 1),
            )
        })?;
        samples.push(sample);
    }
    Ok(Metrics { samples })
}

/// The samples of one metrics text, in order; see [`parse`].
///
/// # Example
///
/// ```
/// let metrics = etcd_sync::testing::metrics::parse("up 1\n")?;
/// assert_eq!(metrics.get("up", &[]), Some(1.0));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    samples: Vec<Sample>,
}

impl Metrics {
    /// Every sample, in the order of the text.
    ///
    /// # Example
    ///
    /// ```
    /// let metrics = etcd_sync::testing::metrics::parse("a 1\nb{x=\"y\"} 2\n")?;
    /// let names: Vec<&str> = metrics.samples().iter().map(|s| s.name.as_str()).collect();
    /// assert_eq!(names, ["a", "b"]);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// The value of the sample named `name` whose labels are exactly `labels` (in any
    /// order), or `None` if there is none. Use [`sum`](Self::sum) to add up the samples
    /// that have some labels in common.
    ///
    /// # Example
    ///
    /// ```
    /// let text = "requests{code=\"200\",path=\"/\"} 7\nrequests{code=\"500\",path=\"/\"} 1\n";
    /// let metrics = etcd_sync::testing::metrics::parse(text)?;
    /// assert_eq!(metrics.get("requests", &[("path", "/"), ("code", "500")]), Some(1.0));
    /// assert_eq!(metrics.get("requests", &[("path", "/")]), None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .find(|sample| {
                sample.name == name
                    && sample.labels.len() == labels.len()
                    && sample.has_labels(labels)
            })
            .map(|sample| sample.value)
    }

    /// The sum of the samples named `name` that have (at least) all of `labels`; `0.0` if
    /// there are none.
    ///
    /// # Example
    ///
    /// ```
    /// let text = "requests{code=\"200\",path=\"/\"} 7\nrequests{code=\"500\",path=\"/\"} 1\n";
    /// let metrics = etcd_sync::testing::metrics::parse(text)?;
    /// assert_eq!(metrics.sum("requests", &[("path", "/")]), 8.0);
    /// assert_eq!(metrics.sum("requests", &[]), 8.0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|sample| sample.name == name && sample.has_labels(labels))
            .map(|sample| sample.value)
            .sum()
    }
}

/// One line of metrics text: a metric name, its labels and a value.
///
/// # Example
///
/// ```
/// let metrics = etcd_sync::testing::metrics::parse("requests{code=\"200\"} 7\n")?;
/// let sample = &metrics.samples()[0];
/// assert_eq!(sample.name, "requests");
/// assert_eq!(sample.label("code"), Some("200"));
/// assert_eq!(sample.value, 7.0);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric name, such as `grpc_server_handled_total`.
    pub name: String,
    /// The labels as `(name, value)` pairs in the order of the text, values unescaped.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of the label `name`, if the sample has it.
    ///
    /// # Example
    ///
    /// ```
    /// let metrics = etcd_sync::testing::metrics::parse("up{job=\"etcd\"} 1\n")?;
    /// assert_eq!(metrics.samples()[0].label("job"), Some("etcd"));
    /// assert_eq!(metrics.samples()[0].label("instance"), None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(label, _)| label == name)
            .map(|(_, value)| value.as_str())
    }

    fn has_labels(&self, labels: &[(&str, &str)]) -> bool {
        labels
            .iter()
            .all(|(name, value)| self.label(name) == Some(*value))
    }
}

/// The unparsed end of one line.
struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    /// `name [{labels}] value [timestamp]`
    fn sample(mut self) -> Result<Sample, &'static str> {
        let name = self.identifier(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        if name.is_empty() {
            return Err("expected a metric name");
        }
        self.skip_whitespace();
        let labels = if self.eat('{') {
            self.labels()?
        } else {
            Vec::new()
        };
        let mut fields = self.rest.split_ascii_whitespace();
        let value = fields
            .next()
            .ok_or("expected a value")?
            .parse::<f64>()
            .map_err(|_| "the value is not a number")?;
        if let Some(timestamp) = fields.next()
            && timestamp.parse::<i64>().is_err()
        {
            return Err("the timestamp is not an integer");
        }
        if fields.next().is_some() {
            return Err("unexpected text after the value");
        }
        Ok(Sample {
            name: name.to_owned(),
            labels,
            value,
        })
    }

    /// The labels after `{`, up to and including `}`; a trailing comma is allowed.
    fn labels(&mut self) -> Result<Vec<(String, String)>, &'static str> {
        let mut labels = Vec::new();
        loop {
            self.skip_whitespace();
            if self.eat('}') {
                return Ok(labels);
            }
            let name = self.identifier(|c| c.is_ascii_alphanumeric() || c == '_');
            if name.is_empty() {
                return Err("expected a label name");
            }
            self.skip_whitespace();
            if !self.eat('=') {
                return Err("expected `=` after a label name");
            }
            self.skip_whitespace();
            if !self.eat('"') {
                return Err("expected a quoted label value");
            }
            let value = self.label_value()?;
            labels.push((name.to_owned(), value));
            self.skip_whitespace();
            if !self.eat(',') && !self.rest.starts_with('}') {
                return Err("expected `,` or `}` after a label");
            }
        }
    }

    /// A label value after its opening quote, up to and including the closing one.
    fn label_value(&mut self) -> Result<String, &'static str> {
        let mut value = String::new();
        let mut chars = self.rest.char_indices();
        while let Some((at, c)) = chars.next() {
            match c {
                '"' => {
                    self.rest = &self.rest[at + 1..];
                    return Ok(value);
                }
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    _ => return Err("unknown escape in a label value"),
                },
                c => value.push(c),
            }
        }
        Err("unterminated label value")
    }

    fn identifier(&mut self, allowed: impl Fn(char) -> bool) -> &'a str {
        let end = self
            .rest
            .char_indices()
            .find(|&(at, c)| !allowed(c) || (at == 0 && c.is_ascii_digit()))
            .map_or(self.rest.len(), |(at, _)| at);
        let (identifier, rest) = self.rest.split_at(end);
        self.rest = rest;
        identifier
    }

    fn eat(&mut self, c: char) -> bool {
        match self.rest.strip_prefix(c) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    fn skip_whitespace(&mut self) {
        self.rest = self.rest.trim_start();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_labels_values_and_skips_comments() {
        let text = "# HELP up Whether the target is up.\n\
                    # TYPE up gauge\n\
                    \n\
                    up 1\n\
                    http_requests_total{method=\"post\",code=\"200\",} 1027 1395066363000\n\
                    weird { a = \"x\\\"y\\\\z\\n\" , b=\"\" } -3.5e2\n\
                    latency_bucket{le=\"+Inf\"} +Inf\n\
                    ratio NaN\n\
                    ns:rule:sum 2\r\n";
        let metrics = parse(text).unwrap();
        assert_eq!(metrics.samples().len(), 6);
        assert_eq!(metrics.get("up", &[]), Some(1.0));
        assert_eq!(
            metrics.get(
                "http_requests_total",
                &[("code", "200"), ("method", "post")]
            ),
            Some(1027.0)
        );
        let weird = &metrics.samples()[2];
        assert_eq!(weird.label("a"), Some("x\"y\\z\n"));
        assert_eq!(weird.label("b"), Some(""));
        assert_eq!(weird.value, -350.0);
        assert_eq!(
            metrics.get("latency_bucket", &[("le", "+Inf")]),
            Some(f64::INFINITY)
        );
        assert!(metrics.get("ratio", &[]).is_some_and(f64::is_nan));
        assert_eq!(metrics.get("ns:rule:sum", &[]), Some(2.0));
    }

    #[test]
    fn get_matches_labels_exactly_and_sum_a_subset() {
        let text =
            "h{m=\"Txn\",c=\"OK\"} 3\nh{m=\"Txn\",c=\"Unavailable\"} 2\nh{m=\"Put\",c=\"OK\"} 5\n";
        let metrics = parse(text).unwrap();
        assert_eq!(metrics.get("h", &[("m", "Txn")]), None);
        assert_eq!(metrics.get("h", &[("c", "OK"), ("m", "Txn")]), Some(3.0));
        assert_eq!(metrics.sum("h", &[("m", "Txn")]), 5.0);
        assert_eq!(metrics.sum("h", &[]), 10.0);
        assert_eq!(metrics.sum("h", &[("m", "Range")]), 0.0);
        assert_eq!(metrics.sum("other", &[]), 0.0);
    }

    #[test]
    fn rejects_lines_that_are_not_samples() {
        for (line, why) in [
            ("up", "expected a value"),
            ("up one", "not a number"),
            ("up 1 soon", "timestamp"),
            ("up 1 2 3", "after the value"),
            ("up{a=\"b} 1", "unterminated"),
            ("up{a=b} 1", "quoted"),
            ("up{a=\"b\" c=\"d\"} 1", "`,` or `}`"),
            ("up{=\"b\"} 1", "label name"),
            ("up{a=\"\\t\"} 1", "escape"),
            ("{a=\"b\"} 1", "metric name"),
            ("9lives 1", "metric name"),
        ] {
            let error = parse(&format!("ok 1\n{line}\n")).unwrap_err();
            assert_eq!(error.kind(), io::ErrorKind::InvalidData);
            let message = error.to_string();
            assert!(
                message.contains("line 2") && message.contains(why),
                "{message}"
            );
        }
    }
}
