//! Prints the path of the etcd binary the crate registry delivered with `etcd-bin-vendored`
//! at the version this folder's Cargo.toml pins (scripts/ensure-etcd VERSION runs it).

fn main() {
    match etcd_bin_vendored::etcd_bin_path() {
        Ok(path) => println!("{}", path.display()),
        Err(error) => {
            eprintln!("etcd-bin: {error}: set ETCD_BIN to an etcd binary you installed");
            std::process::exit(1);
        }
    }
}
