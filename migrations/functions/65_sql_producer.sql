-- queueworker functions: the SQL producer API (`queueworker.enqueue`, `enqueue_many`, `task_status`).
--
-- Repeatable (worker/migrate.py): every file of migrations/functions/ is applied after the versioned
-- migrations, in name order, in one transaction, whenever a versioned migration was applied or one of
-- these files changed. So each holds the current definition of its functions (CREATE OR REPLACE) and
-- re-creates their triggers (DROP TRIGGER IF EXISTS, then CREATE: CREATE OR REPLACE TRIGGER cannot
-- replace a constraint trigger). A SQL-language body is checked when it is created: what it calls
-- must come from an earlier file, or from earlier in the same one. PL/pgSQL bodies are resolved
-- when they run.
--
-- Producers in any language enqueue with one SQL call (docs/producers.md):
--
--     SELECT queueworker.enqueue('send_email', '{"to": "a@example.com"}', queue => 'mail', priority => 5);
--     SELECT queueworker.enqueue_many('[{"task": "a"}, {"task": "b", "delay": 60}]');
--     SELECT * FROM queueworker.task_status(42);
--
-- The arguments are TaskSpec's fields (queueworker.client.producer), checked by the same rules, each
-- refusal one line with SQLSTATE 22023 (invalid_parameter_value); queue grants refuse with 42501
-- (insufficient_privilege), a missing prerequisite with 23503 (foreign_key_violation). The tasks go
-- in through the definer functions the Python producer calls, in its order (enqueue_tasks; for a
-- unique duplicate existing_tasks, then replace_pending with on_conflict 'replace';
-- mark_notify_on_finish), which check the acting login's queue grants and wake the workers of each
-- queue with one NOTIFY, delivered at commit.

-- Whether `value` is text Python's str.isprintable() accepts: no character of the Unicode categories
-- Cc, Cf, Cs, Co, Cn, Zl, Zp, nor of Zs but the space. The class below lists those characters as
-- Python 3.11's Unicode database (14.0.0) has them (Postgres text holds neither NUL nor surrogates);
-- tests/test_sql_producers.py compares it with str.isprintable() on every code point and prints the
-- class anew when they differ.
CREATE OR REPLACE FUNCTION queueworker.printable_text(value text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT value !~ ('['
        '\u0001-\u001F\u007F-\u00A0\u00AD\u0378-\u0379\u0380-\u0383\u038B\u038D\u03A2\u0530\u0557-\u0558'
        '\u058B-\u058C\u0590\u05C8-\u05CF\u05EB-\u05EE\u05F5-\u0605\u061C\u06DD\u070E-\u070F\u074B-\u074C'
        '\u07B2-\u07BF\u07FB-\u07FC\u082E-\u082F\u083F\u085C-\u085D\u085F\u086B-\u086F\u088F-\u0897\u08E2'
        '\u0984\u098D-\u098E\u0991-\u0992\u09A9\u09B1\u09B3-\u09B5\u09BA-\u09BB\u09C5-\u09C6\u09C9-\u09CA'
        '\u09CF-\u09D6\u09D8-\u09DB\u09DE\u09E4-\u09E5\u09FF-\u0A00\u0A04\u0A0B-\u0A0E\u0A11-\u0A12\u0A29'
        '\u0A31\u0A34\u0A37\u0A3A-\u0A3B\u0A3D\u0A43-\u0A46\u0A49-\u0A4A\u0A4E-\u0A50\u0A52-\u0A58\u0A5D'
        '\u0A5F-\u0A65\u0A77-\u0A80\u0A84\u0A8E\u0A92\u0AA9\u0AB1\u0AB4\u0ABA-\u0ABB\u0AC6\u0ACA'
        '\u0ACE-\u0ACF\u0AD1-\u0ADF\u0AE4-\u0AE5\u0AF2-\u0AF8\u0B00\u0B04\u0B0D-\u0B0E\u0B11-\u0B12\u0B29'
        '\u0B31\u0B34\u0B3A-\u0B3B\u0B45-\u0B46\u0B49-\u0B4A\u0B4E-\u0B54\u0B58-\u0B5B\u0B5E\u0B64-\u0B65'
        '\u0B78-\u0B81\u0B84\u0B8B-\u0B8D\u0B91\u0B96-\u0B98\u0B9B\u0B9D\u0BA0-\u0BA2\u0BA5-\u0BA7'
        '\u0BAB-\u0BAD\u0BBA-\u0BBD\u0BC3-\u0BC5\u0BC9\u0BCE-\u0BCF\u0BD1-\u0BD6\u0BD8-\u0BE5'
        '\u0BFB-\u0BFF\u0C0D\u0C11\u0C29\u0C3A-\u0C3B\u0C45\u0C49\u0C4E-\u0C54\u0C57\u0C5B-\u0C5C'
        '\u0C5E-\u0C5F\u0C64-\u0C65\u0C70-\u0C76\u0C8D\u0C91\u0CA9\u0CB4\u0CBA-\u0CBB\u0CC5\u0CC9'
        '\u0CCE-\u0CD4\u0CD7-\u0CDC\u0CDF\u0CE4-\u0CE5\u0CF0\u0CF3-\u0CFF\u0D0D\u0D11\u0D45\u0D49'
        '\u0D50-\u0D53\u0D64-\u0D65\u0D80\u0D84\u0D97-\u0D99\u0DB2\u0DBC\u0DBE-\u0DBF\u0DC7-\u0DC9'
        '\u0DCB-\u0DCE\u0DD5\u0DD7\u0DE0-\u0DE5\u0DF0-\u0DF1\u0DF5-\u0E00\u0E3B-\u0E3E\u0E5C-\u0E80\u0E83'
        '\u0E85\u0E8B\u0EA4\u0EA6\u0EBE-\u0EBF\u0EC5\u0EC7\u0ECE-\u0ECF\u0EDA-\u0EDB\u0EE0-\u0EFF\u0F48'
        '\u0F6D-\u0F70\u0F98\u0FBD\u0FCD\u0FDB-\u0FFF\u10C6\u10C8-\u10CC\u10CE-\u10CF\u1249\u124E-\u124F'
        '\u1257\u1259\u125E-\u125F\u1289\u128E-\u128F\u12B1\u12B6-\u12B7\u12BF\u12C1\u12C6-\u12C7\u12D7'
        '\u1311\u1316-\u1317\u135B-\u135C\u137D-\u137F\u139A-\u139F\u13F6-\u13F7\u13FE-\u13FF\u1680'
        '\u169D-\u169F\u16F9-\u16FF\u1716-\u171E\u1737-\u173F\u1754-\u175F\u176D\u1771\u1774-\u177F'
        '\u17DE-\u17DF\u17EA-\u17EF\u17FA-\u17FF\u180E\u181A-\u181F\u1879-\u187F\u18AB-\u18AF'
        '\u18F6-\u18FF\u191F\u192C-\u192F\u193C-\u193F\u1941-\u1943\u196E-\u196F\u1975-\u197F'
        '\u19AC-\u19AF\u19CA-\u19CF\u19DB-\u19DD\u1A1C-\u1A1D\u1A5F\u1A7D-\u1A7E\u1A8A-\u1A8F'
        '\u1A9A-\u1A9F\u1AAE-\u1AAF\u1ACF-\u1AFF\u1B4D-\u1B4F\u1B7F\u1BF4-\u1BFB\u1C38-\u1C3A'
        '\u1C4A-\u1C4C\u1C89-\u1C8F\u1CBB-\u1CBC\u1CC8-\u1CCF\u1CFB-\u1CFF\u1F16-\u1F17\u1F1E-\u1F1F'
        '\u1F46-\u1F47\u1F4E-\u1F4F\u1F58\u1F5A\u1F5C\u1F5E\u1F7E-\u1F7F\u1FB5\u1FC5\u1FD4-\u1FD5\u1FDC'
        '\u1FF0-\u1FF1\u1FF5\u1FFF-\u200F\u2028-\u202F\u205F-\u206F\u2072-\u2073\u208F\u209D-\u209F'
        '\u20C1-\u20CF\u20F1-\u20FF\u218C-\u218F\u2427-\u243F\u244B-\u245F\u2B74-\u2B75\u2B96'
        '\u2CF4-\u2CF8\u2D26\u2D28-\u2D2C\u2D2E-\u2D2F\u2D68-\u2D6E\u2D71-\u2D7E\u2D97-\u2D9F\u2DA7\u2DAF'
        '\u2DB7\u2DBF\u2DC7\u2DCF\u2DD7\u2DDF\u2E5E-\u2E7F\u2E9A\u2EF4-\u2EFF\u2FD6-\u2FEF\u2FFC-\u3000'
        '\u3040\u3097-\u3098\u3100-\u3104\u3130\u318F\u31E4-\u31EF\u321F\uA48D-\uA48F\uA4C7-\uA4CF'
        '\uA62C-\uA63F\uA6F8-\uA6FF\uA7CB-\uA7CF\uA7D2\uA7D4\uA7DA-\uA7F1\uA82D-\uA82F\uA83A-\uA83F'
        '\uA878-\uA87F\uA8C6-\uA8CD\uA8DA-\uA8DF\uA954-\uA95E\uA97D-\uA97F\uA9CE\uA9DA-\uA9DD\uA9FF'
        '\uAA37-\uAA3F\uAA4E-\uAA4F\uAA5A-\uAA5B\uAAC3-\uAADA\uAAF7-\uAB00\uAB07-\uAB08\uAB0F-\uAB10'
        '\uAB17-\uAB1F\uAB27\uAB2F\uAB6C-\uAB6F\uABEE-\uABEF\uABFA-\uABFF\uD7A4-\uD7AF\uD7C7-\uD7CA'
        '\uD7FC-\uD7FF\uE000-\uF8FF\uFA6E-\uFA6F\uFADA-\uFAFF\uFB07-\uFB12\uFB18-\uFB1C\uFB37\uFB3D\uFB3F'
        '\uFB42\uFB45\uFBC3-\uFBD2\uFD90-\uFD91\uFDC8-\uFDCE\uFDD0-\uFDEF\uFE1A-\uFE1F\uFE53\uFE67'
        '\uFE6C-\uFE6F\uFE75\uFEFD-\uFF00\uFFBF-\uFFC1\uFFC8-\uFFC9\uFFD0-\uFFD1\uFFD8-\uFFD9'
        '\uFFDD-\uFFDF\uFFE7\uFFEF-\uFFFB\uFFFE-\uFFFF\U0001000C\U00010027\U0001003B\U0001003E'
        '\U0001004E-\U0001004F\U0001005E-\U0001007F\U000100FB-\U000100FF\U00010103-\U00010106'
        '\U00010134-\U00010136\U0001018F\U0001019D-\U0001019F\U000101A1-\U000101CF\U000101FE-\U0001027F'
        '\U0001029D-\U0001029F\U000102D1-\U000102DF\U000102FC-\U000102FF\U00010324-\U0001032C'
        '\U0001034B-\U0001034F\U0001037B-\U0001037F\U0001039E\U000103C4-\U000103C7\U000103D6-\U000103FF'
        '\U0001049E-\U0001049F\U000104AA-\U000104AF\U000104D4-\U000104D7\U000104FC-\U000104FF'
        '\U00010528-\U0001052F\U00010564-\U0001056E\U0001057B\U0001058B\U00010593\U00010596\U000105A2'
        '\U000105B2\U000105BA\U000105BD-\U000105FF\U00010737-\U0001073F\U00010756-\U0001075F'
        '\U00010768-\U0001077F\U00010786\U000107B1\U000107BB-\U000107FF\U00010806-\U00010807\U00010809'
        '\U00010836\U00010839-\U0001083B\U0001083D-\U0001083E\U00010856\U0001089F-\U000108A6'
        '\U000108B0-\U000108DF\U000108F3\U000108F6-\U000108FA\U0001091C-\U0001091E\U0001093A-\U0001093E'
        '\U00010940-\U0001097F\U000109B8-\U000109BB\U000109D0-\U000109D1\U00010A04\U00010A07-\U00010A0B'
        '\U00010A14\U00010A18\U00010A36-\U00010A37\U00010A3B-\U00010A3E\U00010A49-\U00010A4F'
        '\U00010A59-\U00010A5F\U00010AA0-\U00010ABF\U00010AE7-\U00010AEA\U00010AF7-\U00010AFF'
        '\U00010B36-\U00010B38\U00010B56-\U00010B57\U00010B73-\U00010B77\U00010B92-\U00010B98'
        '\U00010B9D-\U00010BA8\U00010BB0-\U00010BFF\U00010C49-\U00010C7F\U00010CB3-\U00010CBF'
        '\U00010CF3-\U00010CF9\U00010D28-\U00010D2F\U00010D3A-\U00010E5F\U00010E7F\U00010EAA'
        '\U00010EAE-\U00010EAF\U00010EB2-\U00010EFF\U00010F28-\U00010F2F\U00010F5A-\U00010F6F'
        '\U00010F8A-\U00010FAF\U00010FCC-\U00010FDF\U00010FF7-\U00010FFF\U0001104E-\U00011051'
        '\U00011076-\U0001107E\U000110BD\U000110C3-\U000110CF\U000110E9-\U000110EF\U000110FA-\U000110FF'
        '\U00011135\U00011148-\U0001114F\U00011177-\U0001117F\U000111E0\U000111F5-\U000111FF\U00011212'
        '\U0001123F-\U0001127F\U00011287\U00011289\U0001128E\U0001129E\U000112AA-\U000112AF'
        '\U000112EB-\U000112EF\U000112FA-\U000112FF\U00011304\U0001130D-\U0001130E\U00011311-\U00011312'
        '\U00011329\U00011331\U00011334\U0001133A\U00011345-\U00011346\U00011349-\U0001134A'
        '\U0001134E-\U0001134F\U00011351-\U00011356\U00011358-\U0001135C\U00011364-\U00011365'
        '\U0001136D-\U0001136F\U00011375-\U000113FF\U0001145C\U00011462-\U0001147F\U000114C8-\U000114CF'
        '\U000114DA-\U0001157F\U000115B6-\U000115B7\U000115DE-\U000115FF\U00011645-\U0001164F'
        '\U0001165A-\U0001165F\U0001166D-\U0001167F\U000116BA-\U000116BF\U000116CA-\U000116FF'
        '\U0001171B-\U0001171C\U0001172C-\U0001172F\U00011747-\U000117FF\U0001183C-\U0001189F'
        '\U000118F3-\U000118FE\U00011907-\U00011908\U0001190A-\U0001190B\U00011914\U00011917\U00011936'
        '\U00011939-\U0001193A\U00011947-\U0001194F\U0001195A-\U0001199F\U000119A8-\U000119A9'
        '\U000119D8-\U000119D9\U000119E5-\U000119FF\U00011A48-\U00011A4F\U00011AA3-\U00011AAF'
        '\U00011AF9-\U00011BFF\U00011C09\U00011C37\U00011C46-\U00011C4F\U00011C6D-\U00011C6F'
        '\U00011C90-\U00011C91\U00011CA8\U00011CB7-\U00011CFF\U00011D07\U00011D0A\U00011D37-\U00011D39'
        '\U00011D3B\U00011D3E\U00011D48-\U00011D4F\U00011D5A-\U00011D5F\U00011D66\U00011D69\U00011D8F'
        '\U00011D92\U00011D99-\U00011D9F\U00011DAA-\U00011EDF\U00011EF9-\U00011FAF\U00011FB1-\U00011FBF'
        '\U00011FF2-\U00011FFE\U0001239A-\U000123FF\U0001246F\U00012475-\U0001247F\U00012544-\U00012F8F'
        '\U00012FF3-\U00012FFF\U0001342F-\U000143FF\U00014647-\U000167FF\U00016A39-\U00016A3F\U00016A5F'
        '\U00016A6A-\U00016A6D\U00016ABF\U00016ACA-\U00016ACF\U00016AEE-\U00016AEF\U00016AF6-\U00016AFF'
        '\U00016B46-\U00016B4F\U00016B5A\U00016B62\U00016B78-\U00016B7C\U00016B90-\U00016E3F'
        '\U00016E9B-\U00016EFF\U00016F4B-\U00016F4E\U00016F88-\U00016F8E\U00016FA0-\U00016FDF'
        '\U00016FE5-\U00016FEF\U00016FF2-\U00016FFF\U000187F8-\U000187FF\U00018CD6-\U00018CFF'
        '\U00018D09-\U0001AFEF\U0001AFF4\U0001AFFC\U0001AFFF\U0001B123-\U0001B14F\U0001B153-\U0001B163'
        '\U0001B168-\U0001B16F\U0001B2FC-\U0001BBFF\U0001BC6B-\U0001BC6F\U0001BC7D-\U0001BC7F'
        '\U0001BC89-\U0001BC8F\U0001BC9A-\U0001BC9B\U0001BCA0-\U0001CEFF\U0001CF2E-\U0001CF2F'
        '\U0001CF47-\U0001CF4F\U0001CFC4-\U0001CFFF\U0001D0F6-\U0001D0FF\U0001D127-\U0001D128'
        '\U0001D173-\U0001D17A\U0001D1EB-\U0001D1FF\U0001D246-\U0001D2DF\U0001D2F4-\U0001D2FF'
        '\U0001D357-\U0001D35F\U0001D379-\U0001D3FF\U0001D455\U0001D49D\U0001D4A0-\U0001D4A1'
        '\U0001D4A3-\U0001D4A4\U0001D4A7-\U0001D4A8\U0001D4AD\U0001D4BA\U0001D4BC\U0001D4C4\U0001D506'
        '\U0001D50B-\U0001D50C\U0001D515\U0001D51D\U0001D53A\U0001D53F\U0001D545\U0001D547-\U0001D549'
        '\U0001D551\U0001D6A6-\U0001D6A7\U0001D7CC-\U0001D7CD\U0001DA8C-\U0001DA9A\U0001DAA0'
        '\U0001DAB0-\U0001DEFF\U0001DF1F-\U0001DFFF\U0001E007\U0001E019-\U0001E01A\U0001E022\U0001E025'
        '\U0001E02B-\U0001E0FF\U0001E12D-\U0001E12F\U0001E13E-\U0001E13F\U0001E14A-\U0001E14D'
        '\U0001E150-\U0001E28F\U0001E2AF-\U0001E2BF\U0001E2FA-\U0001E2FE\U0001E300-\U0001E7DF\U0001E7E7'
        '\U0001E7EC\U0001E7EF\U0001E7FF\U0001E8C5-\U0001E8C6\U0001E8D7-\U0001E8FF\U0001E94C-\U0001E94F'
        '\U0001E95A-\U0001E95D\U0001E960-\U0001EC70\U0001ECB5-\U0001ED00\U0001ED3E-\U0001EDFF\U0001EE04'
        '\U0001EE20\U0001EE23\U0001EE25-\U0001EE26\U0001EE28\U0001EE33\U0001EE38\U0001EE3A'
        '\U0001EE3C-\U0001EE41\U0001EE43-\U0001EE46\U0001EE48\U0001EE4A\U0001EE4C\U0001EE50\U0001EE53'
        '\U0001EE55-\U0001EE56\U0001EE58\U0001EE5A\U0001EE5C\U0001EE5E\U0001EE60\U0001EE63'
        '\U0001EE65-\U0001EE66\U0001EE6B\U0001EE73\U0001EE78\U0001EE7D\U0001EE7F\U0001EE8A'
        '\U0001EE9C-\U0001EEA0\U0001EEA4\U0001EEAA\U0001EEBC-\U0001EEEF\U0001EEF2-\U0001EFFF'
        '\U0001F02C-\U0001F02F\U0001F094-\U0001F09F\U0001F0AF-\U0001F0B0\U0001F0C0\U0001F0D0'
        '\U0001F0F6-\U0001F0FF\U0001F1AE-\U0001F1E5\U0001F203-\U0001F20F\U0001F23C-\U0001F23F'
        '\U0001F249-\U0001F24F\U0001F252-\U0001F25F\U0001F266-\U0001F2FF\U0001F6D8-\U0001F6DC'
        '\U0001F6ED-\U0001F6EF\U0001F6FD-\U0001F6FF\U0001F774-\U0001F77F\U0001F7D9-\U0001F7DF'
        '\U0001F7EC-\U0001F7EF\U0001F7F1-\U0001F7FF\U0001F80C-\U0001F80F\U0001F848-\U0001F84F'
        '\U0001F85A-\U0001F85F\U0001F888-\U0001F88F\U0001F8AE-\U0001F8AF\U0001F8B2-\U0001F8FF'
        '\U0001FA54-\U0001FA5F\U0001FA6E-\U0001FA6F\U0001FA75-\U0001FA77\U0001FA7D-\U0001FA7F'
        '\U0001FA87-\U0001FA8F\U0001FAAD-\U0001FAAF\U0001FABB-\U0001FABF\U0001FAC6-\U0001FACF'
        '\U0001FADA-\U0001FADF\U0001FAE8-\U0001FAEF\U0001FAF7-\U0001FAFF\U0001FB93\U0001FBCB-\U0001FBEF'
        '\U0001FBFA-\U0001FFFF\U0002A6E0-\U0002A6FF\U0002B739-\U0002B73F\U0002B81E-\U0002B81F'
        '\U0002CEA2-\U0002CEAF\U0002EBE1-\U0002F7FF\U0002FA1E-\U0002FFFF\U0003134B-\U000E00FF'
        '\U000E01F0-\U0010FFFF'
        ']')
$$;

-- The length of `value` as a JSON string written by Python's json module with ensure_ascii (how
-- TaskSpec counts its headers' bytes): quotes, `"` and `\` escaped in two characters, any other
-- non-ASCII character of the Basic Multilingual Plane in six (\uXXXX), one beyond it in twelve (a
-- surrogate pair). Only for printable text, which holds no control character to escape.
CREATE OR REPLACE FUNCTION queueworker.python_json_length(value text) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT 2 + pg_catalog.length(value)
           + pg_catalog.length(pg_catalog.regexp_replace(value, '[^"\\]', '', 'g'))
           + 5 * pg_catalog.length(pg_catalog.regexp_replace(value, '[^\u0080-\uFFFF]', '', 'g'))
           + 11 * pg_catalog.length(pg_catalog.regexp_replace(value, '[^\U00010000-\U0010FFFF]', '', 'g'))
$$;

-- What is wrong with a task spec, in one line, or NULL: TaskSpec's rules (queueworker.client.producer,
-- queueworker.names), field by field in its order. Two limits of the payload are the worker's:
-- Python reads JSON nested about 1,000 levels deep at most (less the stack its caller holds), and
-- integers of at most 4,300 digits; TaskSpec refuses what its encoder cannot write, here a payload
-- nested more than 900 levels is refused (Python's reader, in a worker, takes that with room to
-- spare), and an integer of more than 4,300 digits, as TaskSpec does.
CREATE OR REPLACE FUNCTION queueworker.task_spec_problem(
    task text, payload jsonb, queue text, priority bigint, run_after timestamptz, delay double precision,
    max_attempts bigint, timeout_seconds bigint, dedupe_key text, dedupe text, on_conflict text, key text,
    depends_on bigint[], on_dependency_failure text, headers jsonb, notify_on_finish boolean)
RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    header record;
    header_bytes bigint := 2;
BEGIN
    IF task IS NULL OR length(task) NOT BETWEEN 1 AND 200 OR NOT queueworker.printable_text(task) OR task !~ '[^ ]' THEN
        RETURN 'task must be printable text of 1 to 200 characters, not only spaces';
    END IF;
    IF payload IS NULL THEN
        RETURN 'payload must be JSON';
    END IF;
    IF jsonb_path_exists(payload, 'strict $.**{900} ? (@.type() == "object" || @.type() == "array")') THEN
        RETURN 'payload is nested more than 900 levels deep';
    END IF;
    -- A number of more than 4,300 digits takes more than 4,300 characters: most payloads are shorter.
    IF length(payload::text) > 4300 AND EXISTS (
        SELECT FROM jsonb_path_query(payload, 'strict $.** ? (@.type() == "number")') AS n(value)
        WHERE n.value #>> '{}' !~ '[.eE]' AND length(ltrim(n.value #>> '{}', '-')) > 4300) THEN
        RETURN 'payload holds an integer of more than 4,300 digits';
    END IF;
    IF queue IS NULL OR queue !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        RETURN 'queue must be letters, digits and _.:- (starting with a letter or digit), at most 128 characters';
    END IF;
    IF priority IS NULL OR priority NOT BETWEEN -2147483648 AND 2147483647 THEN
        RETURN 'priority must be an integer from -2147483648 to 2147483647';
    END IF;
    IF delay IS NOT NULL AND NOT (delay >= 0 AND delay <= 2147483647) THEN  -- NaN compares above every number
        RETURN 'delay must be a number of seconds from 0 to 2147483647';
    END IF;
    IF max_attempts IS NULL OR max_attempts NOT BETWEEN 1 AND 1000 THEN
        RETURN 'max_attempts must be an integer from 1 to 1000';
    END IF;
    IF timeout_seconds NOT BETWEEN 1 AND 2147483647 THEN
        RETURN 'timeout_seconds must be NULL or an integer from 1 to 2147483647';
    END IF;
    IF length(dedupe_key) NOT BETWEEN 1 AND 512 OR NOT queueworker.printable_text(dedupe_key) OR dedupe_key !~ '[^ ]' THEN
        RETURN 'dedupe_key must be NULL or printable text of 1 to 512 characters, not only spaces';
    END IF;
    IF dedupe IS DISTINCT FROM 'spec' AND dedupe IS NOT NULL THEN
        RETURN 'dedupe must be NULL or ''spec''';
    END IF;
    IF on_conflict IS NULL OR on_conflict NOT IN ('ignore', 'replace') THEN
        RETURN 'on_conflict must be ''ignore'' or ''replace''';
    END IF;
    IF depends_on IS NULL OR array_ndims(depends_on) > 1 OR array_position(depends_on, NULL) IS NOT NULL
       OR EXISTS (SELECT FROM unnest(depends_on) AS d(id) WHERE d.id < 1) THEN
        RETURN 'depends_on must be an array of task ids (integers from 1)';
    END IF;
    IF cardinality(depends_on) > 1000 THEN
        RETURN 'depends_on lists more than 1000 tasks';
    END IF;
    IF on_dependency_failure IS NULL OR on_dependency_failure NOT IN ('cancel', 'run') THEN
        RETURN 'on_dependency_failure must be ''cancel'' or ''run''';
    END IF;
    IF notify_on_finish IS NULL THEN
        RETURN 'notify_on_finish must be true or false';
    END IF;
    IF headers IS NOT NULL AND jsonb_typeof(headers) <> 'null' THEN
        IF jsonb_typeof(headers) <> 'object' THEN
            RETURN 'headers must be NULL or a JSON object of strings';
        END IF;
        FOR header IN SELECT h.key AS name, h.value FROM jsonb_each(headers) AS h LOOP
            IF length(header.name) NOT BETWEEN 1 AND 128 OR NOT queueworker.printable_text(header.name)
               OR header.name !~ '[^ ]' THEN
                RETURN 'header names must be printable text of 1 to 128 characters, not only spaces';
            END IF;
            IF jsonb_typeof(header.value) <> 'string' OR length(header.value #>> '{}') > 1024
               OR NOT queueworker.printable_text(header.value #>> '{}') THEN
                RETURN 'header values must be printable text of at most 1024 characters';
            END IF;
            header_bytes := header_bytes + queueworker.python_json_length(header.name) + 2
                            + queueworker.python_json_length(header.value #>> '{}');
        END LOOP;
        IF (SELECT count(*) FROM jsonb_object_keys(headers)) > 32 THEN
            RETURN 'headers must hold at most 32 entries';
        END IF;
        -- As Python writes them: `{"a": "1", "b": "2"}`, entries joined by `, `.
        header_bytes := header_bytes + 2 * greatest((SELECT count(*) FROM jsonb_object_keys(headers)) - 1, 0);
        IF header_bytes > 8192 THEN
            RETURN 'headers take more than 8192 bytes as JSON';
        END IF;
    END IF;
    IF key IS NOT NULL AND (length(key) NOT BETWEEN 1 AND 256 OR NOT queueworker.printable_text(key)) THEN
        RETURN 'key must be NULL or printable text of 1 to 256 characters';
    END IF;
    IF run_after IS NOT NULL AND run_after NOT BETWEEN '0002-01-01 00:00:00+00' AND '9999-12-30 00:00:00+00' THEN
        RETURN 'run_after must lie from 0002-01-01 to 9999-12-30 (UTC)';
    END IF;
    IF run_after IS NOT NULL AND delay IS NOT NULL THEN
        RETURN 'give run_after or delay, not both';
    END IF;
    IF dedupe_key IS NOT NULL AND dedupe IS NOT NULL THEN
        RETURN 'give dedupe_key or dedupe => ''spec'', not both';
    END IF;
    IF on_conflict = 'replace' AND dedupe_key IS NULL AND dedupe IS NULL THEN
        RETURN 'on_conflict => ''replace'' needs a dedupe_key or dedupe => ''spec''';
    END IF;
    IF cardinality(depends_on) <> (SELECT count(DISTINCT d.id) FROM unnest(depends_on) AS d(id)) THEN
        RETURN 'depends_on lists a task twice';
    END IF;
    RETURN NULL;
END
$$;

-- Enqueues checked specs as queueworker.client.producer's plan does, in the caller's transaction:
-- enqueue_tasks inserts them (with their edges: `prerequisite_ords` are 1-based spec positions); a
-- unique spec whose key another unfinished task holds gets that task's id from existing_tasks, and
-- is inserted again (at most three rounds) if that task finished in between; duplicates with
-- `replace` give the task holding their key their payload, priority and due time (replace_pending);
-- tasks with `notify` are marked to announce their end (mark_notify_on_finish). Returns the ids in
-- spec order. The functions it calls check the acting login's queue grants and wake the workers.
CREATE OR REPLACE FUNCTION queueworker.enqueue_checked_specs(
    queues text[], tasks text[], payloads jsonb[], priorities integer[], run_afters timestamptz[],
    max_attempts integer[], timeouts integer[], dedupe_keys text[], by_spec boolean[], cancel_on_failure boolean[],
    prerequisite_ords bigint[], prerequisite_ids bigint[], headers jsonb[], keys text[], replace_duplicates boolean[],
    notify boolean[])
RETURNS bigint[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    spec_count integer := coalesce(cardinality(tasks), 0);
    ids bigint[] := array_fill(NULL::bigint, ARRAY[spec_count]);
    duplicate boolean[] := array_fill(false, ARRAY[spec_count]);
    -- A round's specs: their positions in the arguments (`todo`), and their values (every spec's, in
    -- the first round; later rounds are rare, and take only the specs left).
    todo bigint[] := ARRAY(SELECT generate_series(1, spec_count)::bigint);
    round_queues text[] := queues;
    round_tasks text[] := tasks;
    round_payloads jsonb[] := payloads;
    round_priorities integer[] := priorities;
    round_run_afters timestamptz[] := run_afters;
    round_attempts integer[] := max_attempts;
    round_timeouts integer[] := timeouts;
    round_dedupe_keys text[] := dedupe_keys;
    round_by_spec boolean[] := by_spec;
    round_cancel boolean[] := cancel_on_failure;
    round_edge_ords bigint[] := prerequisite_ords;
    round_edge_ids bigint[] := prerequisite_ids;
    round_headers jsonb[] := headers;
    round_keys text[] := keys;
    missing bigint[];  -- positions in the round of the specs whose key another task held
    missing_queues text[];
    missing_keys text[];
    inserted record;
    found_task record;
    replacing bigint[];
    rounds integer := 0;
BEGIN
    WHILE cardinality(todo) > 0 AND rounds < 3 LOOP
        rounds := rounds + 1;
        missing := '{}';
        missing_queues := '{}';
        missing_keys := '{}';
        FOR inserted IN
            SELECT e.ord, e.queue, e.dedupe_key, e.id FROM queueworker.enqueue_tasks(
                round_queues, round_tasks, round_payloads, round_priorities, round_run_afters, round_attempts,
                round_timeouts, round_dedupe_keys, round_by_spec, round_cancel, round_edge_ords, round_edge_ids,
                array_fill(NULL::bigint, ARRAY[cardinality(todo)]), array_fill(NULL::integer, ARRAY[cardinality(todo)]),
                round_headers, round_keys) AS e
            ORDER BY e.ord
        LOOP
            IF inserted.id IS NULL THEN
                missing := missing || inserted.ord;
                missing_queues := missing_queues || inserted.queue;
                missing_keys := missing_keys || inserted.dedupe_key;
            ELSE
                ids[todo[inserted.ord]] := inserted.id;
            END IF;
        END LOOP;
        IF cardinality(missing) = 0 THEN
            todo := '{}';
            EXIT;
        END IF;
        FOR found_task IN
            SELECT x.ord, x.id
            FROM queueworker.existing_tasks(ARRAY(SELECT todo[m.p] FROM unnest(missing) WITH ORDINALITY AS m(p, n)
                                                  ORDER BY m.n),
                                            missing_queues, missing_keys) AS x
        LOOP
            ids[found_task.ord] := found_task.id;
            duplicate[found_task.ord] := true;
        END LOOP;
        -- The next round: the specs whose key's holder finished and went in between.
        missing := ARRAY(SELECT m.p FROM unnest(missing) WITH ORDINALITY AS m(p, n) WHERE ids[todo[m.p]] IS NULL
                         ORDER BY m.n);
        SELECT array_agg(round_queues[m.p] ORDER BY m.n), array_agg(round_tasks[m.p] ORDER BY m.n),
               array_agg(round_payloads[m.p] ORDER BY m.n), array_agg(round_priorities[m.p] ORDER BY m.n),
               array_agg(round_run_afters[m.p] ORDER BY m.n), array_agg(round_attempts[m.p] ORDER BY m.n),
               array_agg(round_timeouts[m.p] ORDER BY m.n), array_agg(round_dedupe_keys[m.p] ORDER BY m.n),
               array_agg(round_by_spec[m.p] ORDER BY m.n), array_agg(round_cancel[m.p] ORDER BY m.n),
               array_agg(round_headers[m.p] ORDER BY m.n), array_agg(round_keys[m.p] ORDER BY m.n),
               coalesce(array_agg(todo[m.p] ORDER BY m.n), '{}')
        INTO round_queues, round_tasks, round_payloads, round_priorities, round_run_afters, round_attempts,
             round_timeouts, round_dedupe_keys, round_by_spec, round_cancel, round_headers, round_keys, todo
        FROM unnest(missing) WITH ORDINALITY AS m(p, n);
        -- Their edges, by their positions in the next round.
        SELECT coalesce(array_agg(m.n ORDER BY e.en), '{}'), coalesce(array_agg(e.prerequisite ORDER BY e.en), '{}')
        INTO round_edge_ords, round_edge_ids
        FROM unnest(round_edge_ords, round_edge_ids) WITH ORDINALITY AS e(o, prerequisite, en)
        JOIN unnest(missing) WITH ORDINALITY AS m(p, n) ON m.p = e.o;
    END LOOP;
    IF cardinality(todo) > 0 THEN
        RAISE EXCEPTION 'could not enqueue % unique tasks: their keys kept changing hands', cardinality(todo)
            USING ERRCODE = 'serialization_failure', HINT = 'run the transaction again';
    END IF;
    replacing := ARRAY(SELECT s.o FROM generate_series(1, spec_count) AS s(o) WHERE duplicate[s.o] AND replace_duplicates[s.o]
                       ORDER BY s.o);
    IF cardinality(replacing) > 0 THEN
        PERFORM queueworker.replace_pending(ARRAY(SELECT ids[r.o] FROM unnest(replacing) WITH ORDINALITY AS r(o, i) ORDER BY r.i),
                                            ARRAY(SELECT payloads[r.o] FROM unnest(replacing) WITH ORDINALITY AS r(o, i) ORDER BY r.i),
                                            ARRAY(SELECT priorities[r.o] FROM unnest(replacing) WITH ORDINALITY AS r(o, i) ORDER BY r.i),
                                            ARRAY(SELECT run_afters[r.o] FROM unnest(replacing) WITH ORDINALITY AS r(o, i) ORDER BY r.i));
    END IF;
    IF true = ANY(notify) THEN
        PERFORM queueworker.mark_notify_on_finish(ARRAY(SELECT ids[s.o] FROM generate_series(1, spec_count) AS s(o)
                                                        WHERE notify[s.o] ORDER BY s.o));
    END IF;
    RETURN ids;
END
$$;

-- `queueworker.enqueue(task, payload, queue, ...)`: one task, its named arguments TaskSpec's fields
-- with TaskSpec's defaults; returns its id (for a unique duplicate, the id of the task holding its
-- key). A payload of SQL NULL is `{}`, as queueworker.enqueue(conn, task, None) takes it; JSON
-- `null` is stored as the payload. Headers of JSON `null` are none. `delay` counts from the
-- transaction's start (now()), as a task without run_after is due then.
CREATE OR REPLACE FUNCTION queueworker.enqueue(
    task text, payload jsonb DEFAULT '{}', queue text DEFAULT 'default', priority bigint DEFAULT 0,
    run_after timestamptz DEFAULT NULL, delay double precision DEFAULT NULL, max_attempts bigint DEFAULT 10,
    timeout_seconds bigint DEFAULT NULL, dedupe_key text DEFAULT NULL, dedupe text DEFAULT NULL,
    on_conflict text DEFAULT 'ignore', key text DEFAULT NULL, depends_on bigint[] DEFAULT '{}',
    on_dependency_failure text DEFAULT 'cancel', headers jsonb DEFAULT NULL, notify_on_finish boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    given_payload jsonb := coalesce(payload, '{}');
    given_headers jsonb := nullif(headers, 'null');
    problem text := queueworker.task_spec_problem(task, given_payload, queue, priority, run_after, delay, max_attempts,
                                                  timeout_seconds, dedupe_key, dedupe, on_conflict, key, depends_on,
                                                  on_dependency_failure, given_headers, notify_on_finish);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'queueworker.enqueue: %', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN (queueworker.enqueue_checked_specs(
        ARRAY[queue], ARRAY[task], ARRAY[given_payload], ARRAY[priority::integer],
        ARRAY[CASE WHEN delay > 0 THEN now() + delay * interval '1 second' ELSE run_after END],
        ARRAY[max_attempts::integer], ARRAY[timeout_seconds::integer], ARRAY[dedupe_key], ARRAY[dedupe IS NOT NULL],
        ARRAY[on_dependency_failure = 'cancel'], array_fill(1::bigint, ARRAY[cardinality(depends_on)]), depends_on,
        ARRAY[given_headers], ARRAY[key], ARRAY[on_conflict = 'replace'], ARRAY[notify_on_finish]))[1];
END
$$;

-- A field of a spec given to enqueue_many, if it is of JSON type `kind` (or JSON null, which is
-- SQL NULL: TaskSpec's None), else a refusal naming the spec's position; `fallback` when the
-- field is absent.
CREATE OR REPLACE FUNCTION queueworker.spec_field(spec jsonb, spec_position bigint, field text, kind text, fallback jsonb)
RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    value jsonb := spec -> field;
BEGIN
    IF value IS NULL THEN
        RETURN fallback;
    END IF;
    IF jsonb_typeof(value) = 'null' THEN
        RETURN NULL;
    END IF;
    IF kind = 'integer' AND jsonb_typeof(value) = 'number' AND value::text ~ '^-?[0-9]{1,19}$'
       AND value::text::numeric BETWEEN -9223372036854775808 AND 9223372036854775807 THEN
        RETURN value;
    END IF;
    IF kind = 'time' AND jsonb_typeof(value) = 'string'
       AND value #>> '{}' ~ '^\d{4,}-\d\d-\d\d[Tt ]\d\d:\d\d(:\d\d(\.\d+)?)?([Zz]|[+-]\d\d(:?\d\d(:?\d\d)?)?)$' THEN
        BEGIN
            PERFORM (value #>> '{}')::timestamptz;
            RETURN value;
        EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format THEN
            NULL;  -- refused below, as any other value that is not a time
        END;
    END IF;
    IF jsonb_typeof(value) = kind THEN
        RETURN value;
    END IF;
    RAISE EXCEPTION 'queueworker.enqueue_many: spec %: % must be %', spec_position, field,
        CASE kind WHEN 'integer' THEN 'a JSON integer (of 64 bits at most)' WHEN 'time' THEN 'a time with its offset (2026-11-27T10:00:00Z)'
                  ELSE 'a JSON ' || kind END
        USING ERRCODE = 'invalid_parameter_value';
END
$$;

-- `queueworker.enqueue_many(specs)`: a JSON array of specs, each an object of TaskSpec's fields (as
-- queueworker.enqueue takes them: run_after a time with its offset, depends_on an array of ids), in
-- one call; returns their ids in order. Every spec is checked before any is enqueued; a refusal
-- names the spec's position (from 1).
CREATE OR REPLACE FUNCTION queueworker.enqueue_many(specs jsonb)
RETURNS bigint[]
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    fields text[] := ARRAY['task', 'payload', 'queue', 'priority', 'run_after', 'delay', 'max_attempts',
                           'timeout_seconds', 'dedupe_key', 'dedupe', 'on_conflict', 'key', 'depends_on',
                           'on_dependency_failure', 'headers', 'notify_on_finish'];
    spec jsonb;
    spec_position bigint;
    unknown text;
    delay_number numeric;
    problem text;
    task text; payload jsonb; queue text; priority bigint; run_after timestamptz; delay double precision;
    max_attempts bigint; timeout_seconds bigint; dedupe_key text; dedupe text; on_conflict text; key text;
    depends_on bigint[]; on_dependency_failure text; headers jsonb; notify_on_finish boolean;
    queues text[] := '{}'; tasks text[] := '{}'; payloads jsonb[] := '{}'; priorities integer[] := '{}';
    run_afters timestamptz[] := '{}'; attempts integer[] := '{}'; timeouts integer[] := '{}';
    dedupe_keys text[] := '{}'; by_spec boolean[] := '{}'; cancel_on_failure boolean[] := '{}';
    prerequisite_ords bigint[] := '{}'; prerequisite_ids bigint[] := '{}'; header_values jsonb[] := '{}';
    keys text[] := '{}'; replace boolean[] := '{}'; notify boolean[] := '{}';
    plain boolean;
BEGIN
    IF specs IS NULL OR jsonb_typeof(specs) <> 'array' THEN
        RAISE EXCEPTION 'queueworker.enqueue_many: specs must be a JSON array of objects'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A batch of plain specs (no run_after, dependencies or headers; every field of its type and
    -- within task_spec_problem's bounds, and no two that exclude each other) is checked and read in
    -- one statement: the loop below costs about 100 us per spec in calls (spec_field per field,
    -- task_spec_problem per spec), this about 10. Each check is the loop's own rule or a narrower
    -- one, so a spec this statement takes, the loop takes alike; anything else (a refusal included)
    -- goes through the loop, which names the first spec and field that is wrong. A value is cast
    -- only under the CASE that checked it: the statement itself never fails.
    SELECT coalesce(bool_and(c.ok), false), array_agg(c.queue ORDER BY c.n), array_agg(c.task ORDER BY c.n),
           array_agg(c.payload ORDER BY c.n),
           array_agg(CASE WHEN c.ok THEN coalesce((c.priority #>> '{}')::integer, 0) END ORDER BY c.n),
           array_agg(CASE WHEN c.ok THEN CASE WHEN (c.delay #>> '{}')::numeric > 0
                                              THEN now() + (c.delay #>> '{}')::numeric::float8 * interval '1 second' END
                     END ORDER BY c.n),
           array_agg(CASE WHEN c.ok THEN coalesce((c.max_attempts #>> '{}')::integer, 10) END ORDER BY c.n),
           array_agg(CASE WHEN c.ok THEN (c.timeout_seconds #>> '{}')::integer END ORDER BY c.n),
           array_agg(c.dedupe_key #>> '{}' ORDER BY c.n), array_agg(c.dedupe IS NOT NULL ORDER BY c.n),
           array_agg(c.on_dependency_failure IS DISTINCT FROM '"run"' ORDER BY c.n),
           array_agg(NULL::jsonb ORDER BY c.n), array_agg(c.key #>> '{}' ORDER BY c.n),
           array_agg(coalesce(c.on_conflict = '"replace"', false) ORDER BY c.n),
           array_agg(coalesce(c.notify_on_finish = 'true', false) ORDER BY c.n)
    INTO plain, queues, tasks, payloads, priorities, run_afters, attempts, timeouts, dedupe_keys, by_spec,
         cancel_on_failure, header_values, keys, replace, notify
    FROM (
        SELECT v.*, coalesce(v.queue_value #>> '{}', 'default') AS queue, v.task_value #>> '{}' AS task,
               coalesce(CASE WHEN jsonb_typeof(v.spec) = 'object' THEN (v.spec - fields) = '{}' ELSE false END
               AND jsonb_typeof(v.task_value) = 'string' AND length(v.task_value #>> '{}') BETWEEN 1 AND 200
               AND queueworker.printable_text(v.task_value #>> '{}') AND v.task_value #>> '{}' ~ '[^ ]'
               AND NOT jsonb_path_exists(v.payload, 'strict $.**{900} ? (@.type() == "object" || @.type() == "array")')
               AND NOT (length(v.payload::text) > 4300 AND EXISTS (
                   SELECT FROM jsonb_path_query(v.payload, 'strict $.** ? (@.type() == "number")') AS n(value)
                   WHERE n.value #>> '{}' !~ '[.eE]' AND length(ltrim(n.value #>> '{}', '-')) > 4300))
               AND (v.queue_value IS NULL OR jsonb_typeof(v.queue_value) = 'string'
                    AND v.queue_value #>> '{}' ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' AND length(v.queue_value #>> '{}') <= 128)
               AND (v.priority IS NULL OR CASE WHEN jsonb_typeof(v.priority) = 'number' AND v.priority::text ~ '^-?[0-9]{1,10}$'
                                               THEN v.priority::text::bigint BETWEEN -2147483648 AND 2147483647 ELSE false END)
               AND coalesce(jsonb_typeof(v.run_after), 'null') = 'null'
               AND (coalesce(jsonb_typeof(v.delay), 'null') = 'null'
                    OR CASE WHEN jsonb_typeof(v.delay) = 'number'
                            THEN v.delay::text::numeric = 0 OR v.delay::text::numeric BETWEEN 1e-300 AND 2147483647
                            ELSE false END)
               AND (v.max_attempts IS NULL OR CASE WHEN jsonb_typeof(v.max_attempts) = 'number' AND v.max_attempts::text ~ '^[0-9]{1,4}$'
                                                   THEN v.max_attempts::text::integer BETWEEN 1 AND 1000 ELSE false END)
               AND (coalesce(jsonb_typeof(v.timeout_seconds), 'null') = 'null'
                    OR CASE WHEN jsonb_typeof(v.timeout_seconds) = 'number' AND v.timeout_seconds::text ~ '^[0-9]{1,10}$'
                            THEN v.timeout_seconds::text::bigint BETWEEN 1 AND 2147483647 ELSE false END)
               AND (coalesce(jsonb_typeof(v.dedupe_key), 'null') = 'null'
                    OR jsonb_typeof(v.dedupe_key) = 'string' AND length(v.dedupe_key #>> '{}') BETWEEN 1 AND 512
                       AND queueworker.printable_text(v.dedupe_key #>> '{}') AND v.dedupe_key #>> '{}' ~ '[^ ]')
               AND coalesce(v.dedupe, '"spec"') = '"spec"'
               AND coalesce(v.on_conflict, '"ignore"') IN ('"ignore"', '"replace"')
               AND (coalesce(jsonb_typeof(v.key), 'null') = 'null'
                    OR jsonb_typeof(v.key) = 'string' AND length(v.key #>> '{}') BETWEEN 1 AND 256
                       AND queueworker.printable_text(v.key #>> '{}'))
               AND coalesce(v.depends_on, '[]') = '[]'
               AND coalesce(v.on_dependency_failure, '"cancel"') IN ('"cancel"', '"run"')
               AND coalesce(jsonb_typeof(v.headers), 'null') = 'null'
               AND coalesce(v.notify_on_finish, 'false') IN ('true', 'false')
               AND NOT (v.dedupe_key IS NOT NULL AND v.dedupe IS NOT NULL)
               AND (coalesce(v.on_conflict, '"ignore"') <> '"replace"' OR v.dedupe_key IS NOT NULL OR v.dedupe IS NOT NULL),
               false) AS ok
        FROM (SELECT s.n, s.spec, s.spec -> 'task' AS task_value, coalesce(s.spec -> 'payload', '{}') AS payload,
                     s.spec -> 'queue' AS queue_value, s.spec -> 'priority' AS priority, s.spec -> 'run_after' AS run_after,
                     s.spec -> 'delay' AS delay, s.spec -> 'max_attempts' AS max_attempts,
                     s.spec -> 'timeout_seconds' AS timeout_seconds, nullif(s.spec -> 'dedupe_key', 'null') AS dedupe_key,
                     nullif(s.spec -> 'dedupe', 'null') AS dedupe, s.spec -> 'on_conflict' AS on_conflict,
                     nullif(s.spec -> 'key', 'null') AS key, s.spec -> 'depends_on' AS depends_on,
                     s.spec -> 'on_dependency_failure' AS on_dependency_failure, s.spec -> 'headers' AS headers,
                     s.spec -> 'notify_on_finish' AS notify_on_finish
              FROM jsonb_array_elements(specs) WITH ORDINALITY AS s(spec, n)) AS v
        OFFSET 0  -- each spec checked once, not once per aggregate that reads `ok`
    ) AS c;
    IF plain THEN
        RETURN queueworker.enqueue_checked_specs(queues, tasks, payloads, priorities, run_afters, attempts, timeouts,
                                                 dedupe_keys, by_spec, cancel_on_failure, '{}', '{}', header_values,
                                                 keys, replace, notify);
    END IF;
    queues := '{}'; tasks := '{}'; payloads := '{}'; priorities := '{}'; run_afters := '{}'; attempts := '{}';
    timeouts := '{}'; dedupe_keys := '{}'; by_spec := '{}'; cancel_on_failure := '{}'; header_values := '{}';
    keys := '{}'; replace := '{}'; notify := '{}';
    FOR spec, spec_position IN SELECT s.value, s.n FROM jsonb_array_elements(specs) WITH ORDINALITY AS s(value, n) LOOP
        IF jsonb_typeof(spec) <> 'object' THEN
            RAISE EXCEPTION 'queueworker.enqueue_many: spec %: not a JSON object', spec_position
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT k INTO unknown FROM jsonb_object_keys(spec) AS k WHERE k <> ALL (fields) ORDER BY k LIMIT 1;
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'queueworker.enqueue_many: spec %: no field %', spec_position, quote_literal(left(unknown, 40))
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'a spec''s fields are ' || array_to_string(fields, ', ');
        END IF;
        task := queueworker.spec_field(spec, spec_position, 'task', 'string', NULL) #>> '{}';
        payload := coalesce(spec -> 'payload', '{}');  -- JSON null is the payload null, as TaskSpec takes None
        queue := queueworker.spec_field(spec, spec_position, 'queue', 'string', '"default"') #>> '{}';
        priority := (queueworker.spec_field(spec, spec_position, 'priority', 'integer', '0') #>> '{}')::bigint;
        run_after := (queueworker.spec_field(spec, spec_position, 'run_after', 'time', NULL) #>> '{}')::timestamptz;
        delay_number := (queueworker.spec_field(spec, spec_position, 'delay', 'number', NULL) #>> '{}')::numeric;
        -- As a double, as Python reads a JSON number: beyond its range any value is refused alike.
        delay := CASE WHEN delay_number > 1e300 THEN 1e300 WHEN delay_number < -1e300 THEN -1e300
                      WHEN abs(delay_number) < 1e-300 THEN 0 ELSE delay_number END;
        max_attempts := (queueworker.spec_field(spec, spec_position, 'max_attempts', 'integer', '10') #>> '{}')::bigint;
        timeout_seconds := (queueworker.spec_field(spec, spec_position, 'timeout_seconds', 'integer', NULL) #>> '{}')::bigint;
        dedupe_key := queueworker.spec_field(spec, spec_position, 'dedupe_key', 'string', NULL) #>> '{}';
        dedupe := queueworker.spec_field(spec, spec_position, 'dedupe', 'string', NULL) #>> '{}';
        on_conflict := queueworker.spec_field(spec, spec_position, 'on_conflict', 'string', '"ignore"') #>> '{}';
        key := queueworker.spec_field(spec, spec_position, 'key', 'string', NULL) #>> '{}';
        depends_on := ARRAY(SELECT (queueworker.spec_field(jsonb_build_object('depends_on', d.id), spec_position, 'depends_on',
                                                           'integer', NULL) #>> '{}')::bigint
                            FROM jsonb_array_elements(queueworker.spec_field(spec, spec_position, 'depends_on', 'array', '[]'))
                                 WITH ORDINALITY AS d(id, n)
                            ORDER BY d.n);
        IF spec -> 'depends_on' = 'null' THEN
            depends_on := NULL;
        END IF;
        on_dependency_failure := queueworker.spec_field(spec, spec_position, 'on_dependency_failure', 'string', '"cancel"') #>> '{}';
        headers := queueworker.spec_field(spec, spec_position, 'headers', 'object', NULL);
        notify_on_finish := (queueworker.spec_field(spec, spec_position, 'notify_on_finish', 'boolean', 'false') #>> '{}')::boolean;
        problem := queueworker.task_spec_problem(task, payload, queue, priority, run_after, delay, max_attempts,
                                                 timeout_seconds, dedupe_key, dedupe, on_conflict, key, depends_on,
                                                 on_dependency_failure, headers, notify_on_finish);
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'queueworker.enqueue_many: spec %: %', spec_position, problem USING ERRCODE = 'invalid_parameter_value';
        END IF;
        queues := queues || queue;
        tasks := tasks || task;
        payloads := payloads || payload;
        priorities := priorities || priority::integer;
        run_afters := run_afters || CASE WHEN delay > 0 THEN now() + delay * interval '1 second' ELSE run_after END;
        attempts := attempts || max_attempts::integer;
        timeouts := timeouts || timeout_seconds::integer;
        dedupe_keys := dedupe_keys || dedupe_key;
        by_spec := by_spec || (dedupe IS NOT NULL);
        cancel_on_failure := cancel_on_failure || (on_dependency_failure = 'cancel');
        prerequisite_ords := prerequisite_ords || array_fill(spec_position, ARRAY[cardinality(depends_on)]);
        prerequisite_ids := prerequisite_ids || depends_on;
        header_values := header_values || headers;
        keys := keys || key;
        replace := replace || (on_conflict = 'replace');
        notify := notify || notify_on_finish;
    END LOOP;
    RETURN queueworker.enqueue_checked_specs(queues, tasks, payloads, priorities, run_afters, attempts, timeouts,
                                             dedupe_keys, by_spec, cancel_on_failure, prerequisite_ords,
                                             prerequisite_ids, header_values, keys, replace, notify);
END
$$;

-- `queueworker.task_status(id)`: what a producer reads back of a task it enqueued, named as
-- queueworker.client.results.TaskInfo names it; no row for a task that does not exist, was deleted
-- after the retention period, or is in a queue the acting login may not use (queue grants,
-- 15_queue_grants.sql), so a tenant learns nothing of another's tasks.
CREATE OR REPLACE FUNCTION queueworker.task_status(id bigint)
RETURNS TABLE (queue text, task text, state text, attempts integer, max_attempts integer, result jsonb, error jsonb,
               progress jsonb, key text, created_at timestamptz, run_after timestamptz, started_at timestamptz,
               finished_at timestamptz)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT t.queue, t.task, t.state::text, t.attempts, t.max_attempts, t.result, t.error, t.progress, t.key,
           t.created_at, t.run_after, t.started_at, t.finished_at
    FROM queueworker.tasks t
    WHERE t.id = $1 AND t.queue LIKE ANY ((SELECT queueworker.queue_patterns())::text[])
$$;

REVOKE EXECUTE ON FUNCTION
    queueworker.printable_text(text), queueworker.python_json_length(text),
    queueworker.task_spec_problem(text, jsonb, text, bigint, timestamptz, double precision, bigint, bigint, text, text,
                                  text, text, bigint[], text, jsonb, boolean),
    queueworker.enqueue_checked_specs(text[], text[], jsonb[], integer[], timestamptz[], integer[], integer[], text[],
                                      boolean[], boolean[], bigint[], bigint[], jsonb[], text[], boolean[], boolean[]),
    queueworker.enqueue(text, jsonb, text, bigint, timestamptz, double precision, bigint, bigint, text, text, text,
                        text, bigint[], text, jsonb, boolean),
    queueworker.spec_field(jsonb, bigint, text, text, jsonb),
    queueworker.enqueue_many(jsonb), queueworker.task_status(bigint)
FROM PUBLIC;
