//! Shared by the examples: where to find etcd.

/// The etcd to use: the endpoints given on the command line, or (with the `testing`
/// feature) a throwaway server started here and stopped when the returned guard drops.
pub struct Etcd {
    pub endpoints: Vec<String>,
    #[cfg(feature = "testing")]
    _server: Option<etcd_sync::testing::EtcdServer>,
}

impl Etcd {
    /// Whether the server was started here (no endpoints were given).
    #[allow(dead_code)] // not every example asks
    pub fn started_here(&self) -> bool {
        #[cfg(feature = "testing")]
        return self._server.is_some();
        #[cfg(not(feature = "testing"))]
        false
    }
}

pub fn etcd_from_args() -> Result<Etcd, Box<dyn std::error::Error>> {
    let endpoints: Vec<String> = std::env::args().skip(1).collect();
    if !endpoints.is_empty() {
        return Ok(Etcd {
            endpoints,
            #[cfg(feature = "testing")]
            _server: None,
        });
    }
    #[cfg(feature = "testing")]
    {
        let server = etcd_sync::testing::EtcdServer::start()?;
        Ok(Etcd {
            endpoints: server.endpoints(),
            _server: Some(server),
        })
    }
    #[cfg(not(feature = "testing"))]
    Err("pass etcd endpoints, or build with --features testing".into())
}
