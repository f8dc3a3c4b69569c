//! The server SIGKILLed and started again on the same data (`databases.sh restart
//! mysql`): every acknowledged mark survives, so a stale token stays refused.

use palisade::fence::mysql::{self, Error};

use support::databases::{self, runtime};

use crate::{SERVER, connect_app, setup};

#[test]
fn acknowledged_marks_survive_a_server_crash() {
    let _server = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let key = databases::unique("crash");
    runtime().block_on(async {
        let _ = setup().await;
        let mut app = connect_app().await;
        for token in 1..=20 {
            mysql::admit_with(&mut app, &key, token).await.unwrap();
        }
    });
    databases::restart("mysql");
    runtime().block_on(async {
        let mut app = connect_app().await;
        let err = mysql::admit_with(&mut app, &key, 19).await.unwrap_err();
        assert!(
            matches!(&err, Error::Stale(s) if s.highest == 20),
            "{err:?}"
        );
    });
}
